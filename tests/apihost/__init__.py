"""A Django project that installs Leasecast beside its own /api/ routes (tests only)."""
