"""Attention backends: ``torch`` (CPU and reference) and ``triton`` (CUDA kernels)."""
from __future__ import annotations

import torch

from .base import AttentionBackend
from .metadata import AttentionMetadata


def select_backend(name: str, device: torch.device) -> AttentionBackend:
    """Pick the backend: ``auto`` is ``triton`` on CUDA and ``torch`` elsewhere."""
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name == "torch":
        from .torch_backend import TorchAttentionBackend
        return TorchAttentionBackend(cpu_kernel=device.type == "cpu")
    if name == "triton":
        from .triton_backend import TritonAttentionBackend
        return TritonAttentionBackend()
    raise ValueError(f"attention_backend must be 'auto', 'torch' or 'triton', got {name!r}")


__all__ = ["AttentionBackend", "AttentionMetadata", "select_backend"]
