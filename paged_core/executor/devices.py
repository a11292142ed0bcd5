"""Resolve ``device`` and ``dtype`` settings to torch objects."""
from __future__ import annotations

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} was asked for but CUDA is not available; use device='cpu'")
    return device


def device_memory(device: torch.device) -> tuple[int, str]:
    """``(total bytes, name)`` of a CUDA device; ``(0, "")`` for the CPU."""
    if device.type != "cuda":
        return 0, ""
    props = torch.cuda.get_device_properties(device)
    return props.total_memory, props.name


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto`` is bfloat16 (float16 on GPUs without bf16 support)."""
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16
