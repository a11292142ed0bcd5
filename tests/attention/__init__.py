"""The attention backends."""
