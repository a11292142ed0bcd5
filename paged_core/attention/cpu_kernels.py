"""The CPU paged-attention kernel (C++/OpenMP, compiled on first use).

``cpu_paged_attention`` computes attention for a whole packed step (decodes,
prefills and prefill chunks after a cached prefix, mixed) straight from the
paged cache (layout ``[num_kv_heads, num_blocks, block_size, head_dim]``, the
torch backend's), with the same arguments as the Triton ``paged_attention``:
no gather of each sequence's blocks, no padding of queries, no masks. Tasks of
(sequence, kv head, tile of 16 queries) each keep a block-wise online softmax
in float32; every query reads only the keys it may see (causal, sliding window).

The kernel is ``paged_core/cpu/csrc/paged_attention.cpp``, built with the other C++
CPU kernels by ``paged_core.cpu.extension`` (on first use, then cached); where it
cannot be built, the torch backend keeps its plain-torch path. At the ``avx512_bf16``
level, bfloat16 tiles multiply with ``vdpbf16ps`` or, on CPUs with AMX-BF16, AMX tiles
(``PAGED_CORE_CPU_ATTENTION``, ``bf16_attention_amx``).
"""
from __future__ import annotations

import torch

from ..cpu.extension import amx_granted, cpu_ops
from ..cpu.isa import ATTENTION_SETTING, selected_cpu_isa
from ..cpu.kv_prefetch import kv_first_line


def bf16_attention_amx(cpu_isa: str | None = None) -> bool:
    """True if the ``cpu_isa`` build (default: the selected level) multiplies bfloat16
    attention tiles on AMX: the ``avx512_bf16`` level with ``PAGED_CORE_CPU_ATTENTION``
    selecting ``amx`` (``auto``: CPUs with AMX-BF16) and the OS granting the tile state
    (``cpu.extension.amx_granted``: else ``auto`` is False and ``amx`` raises ``RuntimeError``)."""
    return (cpu_isa or selected_cpu_isa()) == "avx512_bf16" and amx_granted(ATTENTION_SETTING)


def cpu_paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        block_tables: torch.Tensor, seq_lens: torch.Tensor,
                        query_start_loc: torch.Tensor, scale: float,
                        sliding_window: int | None = None,
                        out: torch.Tensor | None = None, cpu_isa: str | None = None,
                        logits_soft_cap: float | None = None,
                        amx_tiles: bool | None = None, decode_loop: bool = True,
                        kv_prefetch: str | None = None) -> torch.Tensor:
    """Attention of a packed step's queries over each sequence's paged context.

    ``query`` ``[num_tokens, Hq, D]`` (a strided last dim is copied first): sequence ``s``
    owns rows ``query_start_loc[s]:query_start_loc[s+1]``, its newest tokens, at positions
    ``seq_lens[s] - q_len .. seq_lens[s] - 1``; a query at position ``p`` sees keys
    ``k <= p`` (and ``k > p - sliding_window``); with ``logits_soft_cap`` ``c`` its scaled
    scores ``s`` become ``c * tanh(s / c)``. Caches ``[Hk, num_blocks, block_size, D]``
    contiguous; ``block_tables`` ``[S, max_blocks]``, ``seq_lens`` ``[S]``,
    ``query_start_loc`` ``[S + 1]``, integers (read in place where int32 with contiguous
    rows, as the engine's metadata is; copied otherwise). ``Hq`` must be a multiple of ``Hk``.
    float32 or bfloat16 (accumulated in float32). Returns ``[num_tokens, Hq, D]`` in the
    query dtype, written into ``out`` (contiguous, like query) if given; rows past
    ``query_start_loc[-1]`` (padding) are left as they were.
    ``cpu_isa`` picks the build (``paged_core.cpu.isa`` level; default: the selected one);
    ``amx_tiles`` whether its bfloat16 tiles multiply on AMX (default:
    ``bf16_attention_amx(cpu_isa)``; True needs that to be possible); ``decode_loop`` whether
    the ``avx512_bf16`` build's one-query units take their own loop and its prompt tiles split
    long key ranges by their query count (faster decode and prefill; off, every query runs on
    the tiles, cut at the same positions, so a token gets the same bits alone or inside a
    prompt chunk); ``kv_prefetch`` how that decode loop starts K and V into L2
    (``paged_core.cpu.kv_prefetch``: ``every_line`` or ``first_line``; default: the selected
    one; the same bits either way).
    Raises ``RuntimeError`` if that kernel is unavailable (``cpu_extension_available``)
    or an argument is inconsistent (the message says which).
    """
    ops = cpu_ops(cpu_isa)
    if sliding_window is not None and sliding_window <= 0:
        raise ValueError(f"sliding_window must be positive, got {sliding_window}")
    if logits_soft_cap is not None and not logits_soft_cap > 0:
        raise ValueError(f"logits_soft_cap must be positive or None, got {logits_soft_cap}")
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if amx_tiles is None:
        amx_tiles = bf16_attention_amx(cpu_isa)
    ops.paged_attention(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
                        float(scale), int(sliding_window or 0),
                        float(logits_soft_cap or 0.0), out, bool(amx_tiles), bool(decode_loop),
                        kv_first_line(kv_prefetch))
    return out
