"""engine_proc package."""
