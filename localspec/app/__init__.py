"""What every front end shares: engine, config, catalog, conversation, traces, invariance."""
