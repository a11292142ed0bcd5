"""Integer levels packed into int32 words, and their groups, as the folder readers store them.

Every packed format served here (compressed-tensors ``pack-quantized``, GPTQ, AWQ) puts
``32 // bits`` values in an int32 word, value ``i`` at bit ``i * bits`` (low bits first);
they differ only in which axis is packed and, for AWQ, in the order of the values within a
word (``AWQ_ORDER``). ``regroup`` fits a reader's groups to what the int4 kernel takes.
"""
from __future__ import annotations

import torch

from .int4_linear import kernel_takes

# AWQ's GEMM layout: the word's value i is output column AWQ_ORDER[i] of its eight
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def unpack_ints(packed: torch.Tensor, bits: int, width: int) -> torch.Tensor:
    """``[rows, ceil(width * bits / 32)]`` int32 words → ``[rows, width]`` unsigned values
    (int16): value ``i`` of a row sits at bit ``i * bits`` of its words."""
    per_word = 32 // bits
    shifts = torch.arange(per_word, dtype=torch.int64) * bits
    words = packed.to(torch.int64) & 0xFFFFFFFF
    values = (words[..., None] >> shifts) & ((1 << bits) - 1)
    return values.reshape(packed.shape[0], -1)[:, :width].to(torch.int16)


def unpack_awq(packed: torch.Tensor, width: int) -> torch.Tensor:
    """AWQ's 4-bit ``[rows, width / 8]`` words → ``[rows, width]`` values in column order."""
    values = unpack_ints(packed, 4, width).view(packed.shape[0], -1, 8)
    inverse = sorted(range(8), key=AWQ_ORDER.__getitem__)  # column c is value inverse[c]
    return values[..., inverse].reshape(packed.shape[0], width)


def regroup(scales: torch.Tensor, zeros: torch.Tensor | None, group_size: int, width: int,
            module: str) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """``[out, ceil(width / group_size)]`` scales (and zeros) over groups of ``group_size``
    input features → the same weight in groups the kernels take (``kernel_takes``):
    each group split in equal sub-groups that repeat its scale and zero (exact). A last
    partial group must split the same way; otherwise ``ValueError`` naming ``module``."""
    if kernel_takes(group_size, width):
        return scales, zeros, group_size
    fits = [g for g in range(16, group_size + 1, 16)
            if group_size % g == 0 and kernel_takes(g, width)]
    if not fits:
        raise ValueError(f"{module}: groups of {group_size} over {width} input features do not "
                         f"split into whole groups of a multiple of 16 (what the kernels take)")
    size = max(fits)
    index = torch.arange(width // size) * size // group_size
    return scales[:, index], None if zeros is None else zeros[:, index], size
