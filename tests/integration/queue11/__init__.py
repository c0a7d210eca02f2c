"""Work queue 1.1 against real gateways: groups, priority, ttl, bounded queues, browsing."""
