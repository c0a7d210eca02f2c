"""The operator UI: the live dashboard page and the Django admin."""
