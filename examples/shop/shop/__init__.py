"""An ordinary Django project that installs Leasecast (see examples/shop/README.md)."""
