"""The shop's orders: placing one hands work to Leasecast in the same transaction."""
