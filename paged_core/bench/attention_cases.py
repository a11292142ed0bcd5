"""The inputs ``bench attention`` times: model shapes, paged steps over a KV pool, torch SDPA.

A ``KvPool`` is one dtype's K and V caches (the engine's layout, ``[Hk, blocks, block_size,
D]``, random values) of a fixed number of blocks, allocated as the engine allocates its cache
(``zeros_on_huge_pages``: on 4 KiB pages nearly every block read would add a page walk that
the engine does not pay). A ``PagedStep`` is one packed step over
it (``batch`` sequences of ``seq_len`` tokens, the newest ``query_len`` of each are queries)
with ``instances`` copies of its block tables, in one of two layouts (``BLOCK_LAYOUTS``):
``scattered``, each sequence's blocks at random places (``shuffled_block_tables``: the
worst case, every block a run of its own), or ``consecutive``, each sequence's blocks one
after another in the pool (what the engine's allocator hands out for a prompt from a pool
in order: in the long-tailed mix, 62-70% of a running engine's neighbouring blocks were
physical neighbours). Invariants: every block of every copy is a different pool block,
and calls of a step (whatever the CPU path) walk the copies in turn; so a call reads K and V
that the previous ``instances - 1`` calls did not touch, and once the pool is several times
the last-level cache, decode reads come from memory, as they do in a serving engine. A fresh
prefill is the exception: the engine writes a prompt's K and V into its blocks just before
the same layer attends over them (``write_kv``; the C++ decoder stack's ``write_slots``), so
its attention reads them from cache, and its step takes one copy (``copies=1``). One
128-token SmolLM2-shaped prompt took 87.0-87.4 us right after ``write_kv_slots`` wrote its K
and V into fresh blocks, 85.7-86.0 re-reading one copy and 90.4-91.0 over copies not read
since (four prompts 334-337, 330-331, 342-343 us; AMD EPYC family 25 model 17, avx512_bf16,
2 threads, ``write_kv_slots`` timed alone and taken off).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..attention.cpu_kernels import cpu_paged_attention
from ..cpu.huge_pages import zeros_on_huge_pages
from ..cpu.kv_prefetch import selected_kv_prefetch
from ..kernels.reference import shuffled_block_tables


@dataclass(frozen=True)
class ModelShape:
    """The attention and projection sizes of one model layer."""
    name: str
    kv_heads: int
    group: int  # query heads per KV head
    head_dim: int
    hidden: int
    intermediate: int
    block_size: int = 16

    @property
    def heads(self) -> int:
        return self.kv_heads * self.group

    def kv_bytes(self, tokens: int, dtype: torch.dtype) -> int:
        """Bytes of K and V of ``tokens`` tokens (all KV heads)."""
        return 2 * tokens * self.kv_heads * self.head_dim * dtype.itemsize

    def causal_flops(self, prompt: int) -> int:
        """FLOPs of causal attention over a fresh ``prompt``-token sequence: two matmuls
        (QK^T, PV) of 2 FLOPs per multiply-add over its ``prompt * (prompt + 1) / 2``
        (query, key) pairs, per query head."""
        return 4 * (prompt * (prompt + 1) // 2) * self.head_dim * self.heads

    def projections(self) -> list[tuple[int, int]]:
        """(in, out) features of the layer's linears as the engine fuses them: qkv, o,
        gate_up, down."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return [(self.hidden, q + 2 * kv), (q, self.hidden),
                (self.hidden, 2 * self.intermediate), (self.intermediate, self.hidden)]


SMOLLM2 = ModelShape("SmolLM2-135M", kv_heads=3, group=3, head_dim=64, hidden=576,
                     intermediate=1536)
LLAMA_8B = ModelShape("Llama-8B-like", kv_heads=8, group=4, head_dim=128, hidden=4096,
                      intermediate=14336)


@dataclass
class KvPool:
    shape: ModelShape
    dtype: torch.dtype
    k: torch.Tensor
    v: torch.Tensor

    @property
    def num_blocks(self) -> int:
        return self.k.shape[1]


def kv_pool(shape: ModelShape, dtype: torch.dtype, num_blocks: int,
            generator: torch.Generator) -> KvPool:
    dims = (shape.kv_heads, num_blocks, shape.block_size, shape.head_dim)
    k, v = (zeros_on_huge_pages(dims, dtype).normal_(generator=generator) for _ in range(2))
    return KvPool(shape, dtype, k, v)


def blocks_for(shape: ModelShape, batch: int, seq_len: int) -> int:
    """Pool blocks one copy of a step's block tables takes."""
    return batch * math.ceil(seq_len / shape.block_size)


@dataclass
class PagedStep:
    pool: KvPool
    batch: int
    seq_len: int
    query: torch.Tensor  # [batch * query_len, Hq, D]
    tables: torch.Tensor  # [instances, batch, max_blocks], int32
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    _next: int = 0  # the copy the next call reads

    @property
    def instances(self) -> int:
        return self.tables.shape[0]

    def call(self, cpu_isa: str, amx_tiles: bool = False) -> Callable[[], torch.Tensor]:
        """The step through the ``cpu_isa`` build of the C++ kernel (bfloat16 tiles on AMX
        with ``amx_tiles``), on the next table copy each invocation (its output buffer is
        reused), with the KV prefetch policy selected now, as the engine's attention backend
        fixes it at construction."""
        out = torch.empty_like(self.query)
        scale = self.pool.shape.head_dim ** -0.5
        kv_prefetch = selected_kv_prefetch()
        tables = list(self.tables)  # views made once, not per call

        def attend() -> torch.Tensor:
            i = self._next
            self._next = (i + 1) % self.instances
            return cpu_paged_attention(self.query, self.pool.k, self.pool.v, tables[i],
                                       self.seq_lens, self.query_start_loc, scale, out=out,
                                       cpu_isa=cpu_isa, amx_tiles=amx_tiles,
                                       kv_prefetch=kv_prefetch)
        return attend


BLOCK_LAYOUTS = ("scattered", "consecutive")


def paged_step(pool: KvPool, batch: int, seq_len: int, query_len: int,
               generator: torch.Generator, layout: str = "scattered",
               copies: int | None = None) -> PagedStep:
    """``batch`` sequences of ``seq_len`` tokens whose last ``query_len`` are queries (1: a
    decode; ``seq_len``: a fresh prefill), with ``copies`` table copies (default: as many
    as the pool holds; 1: every call reads the same blocks, which stay in cache), their
    blocks laid out as ``layout`` (``BLOCK_LAYOUTS``) says."""
    if layout not in BLOCK_LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(BLOCK_LAYOUTS)}, got {layout!r}")
    shape = pool.shape
    per_copy = blocks_for(shape, batch, seq_len)
    if per_copy > pool.num_blocks:
        raise ValueError(f"{batch} x {seq_len} tokens need {per_copy} blocks, the pool has "
                         f"{pool.num_blocks}")
    instances = min(copies or pool.num_blocks, pool.num_blocks // per_copy)
    if layout == "consecutive":
        tables = torch.arange(per_copy * instances, dtype=torch.int32).view(batch * instances, -1)
    else:
        tables, _ = shuffled_block_tables([seq_len] * (batch * instances), shape.block_size,
                                          extra_blocks=pool.num_blocks - per_copy * instances,
                                          generator=generator)
    query = torch.empty(batch * query_len, shape.heads, shape.head_dim,
                        dtype=pool.dtype).normal_(generator=generator)
    return PagedStep(pool, batch, seq_len, query, tables.view(instances, batch, -1),
                     torch.full((batch,), seq_len, dtype=torch.int32),
                     torch.arange(0, (batch + 1) * query_len, query_len, dtype=torch.int32))


def sdpa_call(shape: ModelShape, dtype: torch.dtype, batch: int, prompt: int,
              generator: torch.Generator) -> Callable[[], torch.Tensor]:
    """torch's causal ``scaled_dot_product_attention`` over a fresh prompt, K and V
    contiguous ``[batch, Hk, prompt, D]`` (grouped queries: ``enable_gqa``)."""
    def rand(heads: int) -> torch.Tensor:
        return torch.empty(batch, heads, prompt, shape.head_dim,
                           dtype=dtype).normal_(generator=generator)

    q, k, v = rand(shape.heads), rand(shape.kv_heads), rand(shape.kv_heads)
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
