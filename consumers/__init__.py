"""Channels consumers and HTTP views: thin adapters over the gateway engine."""
