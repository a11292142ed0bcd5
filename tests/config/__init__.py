"""Configuration: EngineConfig, its parts, the CLI's settings."""
