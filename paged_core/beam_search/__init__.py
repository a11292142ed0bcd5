"""Beam search: its params, its results and the engine-side request that runs it."""
