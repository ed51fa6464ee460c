"""Policy-state stores: Redis in production, process memory for the embedded default; one interface."""
