"""Bytes a model holds, and bytes one decode step must read from memory.

- ``model_bytes``: every weight tensor a model holds (parameters and the prepacked or
  quantized copies its linears keep as plain tensor attributes), each storage once;
- ``step_weight_bytes``: the weights a decode step reads whole: all of those but the
  input embedding's table, of which a step reads only its tokens' rows (unless the LM
  head multiplies by that very table: a tied head left unpacked, ``lm_head is None``);
  with experts (MoE) every expert counts, an upper bound on what one step reads;
- ``kv_cache_bytes``: every layer's KV cache tensors.

A decode step of a dense model on a CPU is bound by memory: it cannot take less than
(``step_weight_bytes`` + the KV bytes of the tokens of context its sequences hold,
``model_runner.kv_cache_bytes_per_block`` per block) / the machine's memory bandwidth
(``bench steps`` sets its steps against that).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the storages behind ``tensors``, each storage counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in tensors:
        if t.is_mkldnn:  # a prepacked float32 weight: oneDNN's opaque storage, owned alone
            key = (id(t), t.numel() * t.element_size())
        else:
            key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if key not in seen:
            seen.add(key)
            total += key[1]
    return total


def span_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes the address ranges of ``tensors`` cover together (each range from a tensor's
    first element to its last; overlaps counted once): unlike ``tensor_bytes``, a view
    counts only its own part of a shared storage (the CPU packs every weight into one
    arena)."""
    spans, opaque = [], 0
    for t in tensors:
        if t.is_mkldnn:  # oneDNN's opaque storage, owned alone
            opaque += t.numel() * t.element_size()
        elif t.numel():
            extent = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) + 1
            spans.append((t.data_ptr(), t.data_ptr() + extent * t.element_size()))
    total, reached = opaque, 0
    for start, end in sorted(spans):
        total += max(0, end - max(start, reached))
        reached = max(reached, end)
    return total


def _weights(modules: Iterable[nn.Module]) -> Iterator[torch.Tensor]:
    """The parameters of ``modules`` and the tensors they keep as plain attributes
    (prepacked and quantized linears), not their buffers (rotary tables, caches)."""
    for module in modules:
        yield from module.parameters(recurse=False)
        yield from (v for v in vars(module).values() if isinstance(v, torch.Tensor))


def model_bytes(model: nn.Module) -> int:
    """Bytes of every weight ``model`` holds (shared or tied storages counted once)."""
    return tensor_bytes(_weights(model.modules()))


def step_weight_bytes(model: nn.Module) -> int:
    """Bytes of the weights one decode step reads whole (see the module doc): every weight
    but the input embedding's table, which counts only where the LM head is that table."""
    embedding = getattr(model, "embed_tokens", None)
    head_reads_table = embedding is not None and getattr(model, "lm_head", None) is None
    skipped = set() if head_reads_table else {id(embedding)}
    return span_bytes(_weights(m for m in model.modules() if id(m) not in skipped))


def kv_cache_bytes(kv_caches: list[tuple[torch.Tensor, ...]]) -> int:
    """Bytes of every layer's KV cache tensors."""
    return tensor_bytes(t for layer in kv_caches for t in layer)

