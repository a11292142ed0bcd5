"""Greedy parity with transformers: the embedded model, tiny models of each family, bf16."""
