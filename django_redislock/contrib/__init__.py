"""Optional integrations. Each module imports its framework; import only what you use."""
