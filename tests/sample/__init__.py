"""Sampling: the sampler and per-request sampling behaviour."""
