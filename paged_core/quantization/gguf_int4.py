"""A GGUF file's 4-bit projections (Q4_0, Q4_1) as ``Int4Weight``s, under Hugging Face names.

Both formats cut a row into blocks of 32 weights: a float16 scale ``d`` (and, for Q4_1, a
float16 minimum ``m``) then 16 bytes of levels, the low nibbles holding weights 0-15 and the
high nibbles weights 16-31. Q4_0 is ``d * (q - 8)``, Q4_1 is ``d * q + m``: both are
``Int4Weight`` groups of 32, exactly (scales kept in float32). llama.cpp stores Llama's q and
k projections with the rows of each head interleaved for its rotary layout; they are put back
in Hugging Face's order, as transformers does when it reads the file. Other tensor types
(the Q8_0 embedding, the F32 norms) come from the converted safetensors copy.
"""
from __future__ import annotations

import re

import numpy as np
import torch

from .int4_linear import Int4Weight

_BLOCK = 32
_PROJECTIONS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def gguf_int4_weights(path: str, num_heads: int, num_kv_heads: int) -> dict[str, Int4Weight]:
    """Every Q4_0 / Q4_1 projection of the file at ``path``, keyed by its Hugging Face weight
    name (``model.layers.{i}.self_attn.q_proj.weight``, ...)."""
    from gguf import GGMLQuantizationType, GGUFReader

    kinds = {GGMLQuantizationType.Q4_0: False, GGMLQuantizationType.Q4_1: True}
    weights = {}
    for tensor in GGUFReader(path).tensors:
        match = _NAME.fullmatch(tensor.name)
        if match is None or match[2] not in _PROJECTIONS or tensor.tensor_type not in kinds:
            continue
        width, rows = (int(n) for n in tensor.shape[:2])  # GGUF lists the fastest dimension first
        weight = _decode(np.asarray(tensor.data), rows, width, has_min=kinds[tensor.tensor_type])
        if match[2] in ("attn_q", "attn_k"):
            weight = _rows(weight, _unpermute(rows, num_heads if match[2] == "attn_q" else num_kv_heads))
        weights[f"model.layers.{match[1]}.{_PROJECTIONS[match[2]]}.weight"] = weight
    return weights


def _decode(raw: np.ndarray, rows: int, width: int, has_min: bool) -> Int4Weight:
    """Q4_1 (``has_min``) or Q4_0 blocks of a ``[rows, width]`` weight."""
    header = 4 if has_min else 2
    blocks = raw.reshape(rows, width // _BLOCK, header + _BLOCK // 2)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    packed = blocks[..., header:]
    q = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).reshape(rows, width)
    scales = torch.from_numpy(d)
    if has_min:
        m = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32))
        zeros = m + 8 * scales
    else:
        zeros = torch.zeros_like(scales)
    return Int4Weight(torch.from_numpy(q.astype(np.uint8)), scales, zeros, _BLOCK)


def _unpermute(rows: int, heads: int) -> torch.Tensor:
    """The row order that undoes llama.cpp's rotary interleave of a q or k projection."""
    return torch.arange(rows).view(heads, rows // heads // 2, 2).transpose(1, 2).reshape(rows)


def _rows(weight: Int4Weight, order: torch.Tensor) -> Int4Weight:
    return Int4Weight(weight.q[order], weight.scales[order], weight.zeros[order], weight.group_size)
