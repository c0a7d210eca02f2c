"""Adapters of other systems (and of Leasecast) for the common load generator of bench.headline."""
