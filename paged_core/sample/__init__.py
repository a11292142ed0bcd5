"""Sampling: the sampler and the per-step plan of the rows it draws."""
