"""``DecodeGraphs``: the model's decode forward captured as CUDA graphs, one per batch size.

A decode step (every sequence adds one token) launches a few hundred small
kernels; replaying a captured graph launches them as one. Graphs are captured
once, after the KV cache exists, for the padded batch sizes ``capture_sizes``
(1, 2, 4, 8, then every 8 up to ``max_num_seqs``, at most 256); a step of ``n``
sequences replays the smallest graph of at least ``n`` rows.

Invariants:
- every graph reads its inputs from the same static buffers (``input_ids``,
  ``rope_rows``, ``slot_mapping``, ``block_tables``, ``seq_lens``,
  ``query_start_loc``); ``run`` copies a step into them before replaying;
- padding sequences have no new token (``query_start_loc`` repeats the last real
  offset, ``seq_lens`` 0, ``slot_mapping`` -1): the attention kernels skip them
  and no K/V is stored; their output rows are unspecified and never read;
- the kernels were captured with ``max_seq_len`` = ``max_model_len`` as their
  tuning hint, so the captured launch grid serves any context length;
- only the decoder runs in the graph: the LM head runs eagerly on the rows
  sampled, so a graph's memory is one step's activations (from one shared pool).

Steps that do not fit (prefill, chunked prefill, speculative verification, more
sequences than the largest graph, block tables wider than captured) run eagerly.
"""
from __future__ import annotations

import logging

import torch

from ..attention import AttentionBackend, AttentionMetadata
from .packed_batch import PackedBatch

logger = logging.getLogger("paged_core.cuda_graphs")

_MAX_CAPTURE_SIZE = 256


def capture_sizes(max_num_seqs: int) -> list[int]:
    """Batch sizes to capture: 1, 2, 4, 8, then multiples of 8 up to ``max_num_seqs``
    (capped at 256), always including the cap itself."""
    cap = min(max_num_seqs, _MAX_CAPTURE_SIZE)
    sizes = [s for s in (1, 2, 4) if s < cap] + list(range(8, cap + 1, 8))
    if not sizes or sizes[-1] != cap:
        sizes.append(cap)
    return sizes


class DecodeGraphs:
    """Captured decode forwards of ``model`` over ``kv_caches`` (see the module docstring)."""

    def __init__(self, model, backend: AttentionBackend,
                 kv_caches: list[tuple[torch.Tensor, torch.Tensor]], max_num_seqs: int,
                 max_model_len: int, block_size: int, device: torch.device) -> None:
        self.model, self.backend, self.kv_caches = model, backend, kv_caches
        self.sizes = capture_sizes(max_num_seqs)
        self.max_model_len = max_model_len
        rows, width = self.sizes[-1], -(-max_model_len // block_size)
        self.input_ids = torch.zeros(rows, dtype=torch.int64, device=device)
        self.rope_rows = torch.zeros(rows, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((rows,), -1, dtype=torch.int64, device=device)
        self.block_tables = torch.zeros(rows, width, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(rows, dtype=torch.int32, device=device)
        self.query_start_loc = torch.zeros(rows + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool_bytes = 0
        self.replays = 0  # decode steps served by a graph

    def _meta(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:size], block_tables=self.block_tables[:size],
            seq_lens=self.seq_lens[:size], query_start_loc=self.query_start_loc[:size + 1],
            max_query_len=1, max_seq_len=self.max_model_len,
            seq_lens_cpu=[1] * size, query_lens_cpu=[1] * size)

    def _forward(self, size: int) -> torch.Tensor:
        return self.model(self.input_ids[:size], self.rope_rows[:size], self.kv_caches,
                          self._meta(size), self.backend)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size, largest first (the smaller ones reuse its pool's memory).
        The dummy step stores nothing (slots -1) and reads one key of block 0."""
        self.seq_lens.fill_(1)
        self.query_start_loc.copy_(torch.arange(self.query_start_loc.shape[0],
                                                dtype=torch.int32))
        before = torch.cuda.memory_reserved()
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for size in reversed(self.sizes):
                self._forward(size)  # warm-up: compiles kernels, sets up library handles
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    self.outputs[size] = self._forward(size)
                self.graphs[size] = graph
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        self.pool_bytes = torch.cuda.memory_reserved() - before
        logger.info("captured decode CUDA graphs for %d batch sizes (%s) in %.1f MiB",
                    len(self.sizes), self.sizes, self.pool_bytes / 2**20)

    def fits(self, packed: PackedBatch) -> bool:
        """Whether ``packed`` is a decode step a captured graph can run."""
        return (packed.is_decode_only and packed.num_seqs <= self.sizes[-1]
                and packed.block_tables.shape[1] <= self.block_tables.shape[1])

    def run(self, packed: PackedBatch) -> torch.Tensor:
        """Replay the graph for ``packed`` (``fits`` holds); returns the hidden states of its
        ``num_tokens`` rows (a view of the graph's output: read it before the next replay)."""
        n = packed.num_tokens
        size = next(s for s in self.sizes if s >= n)
        device = self.input_ids.device

        def fill(buffer: torch.Tensor, values, pad) -> None:
            buffer[:n].copy_(torch.from_numpy(values[:n]).to(device, non_blocking=True))
            buffer[n:size].fill_(pad)

        fill(self.input_ids, packed.input_ids, 0)
        fill(self.rope_rows, packed.rope_rows, 0)
        fill(self.slot_mapping, packed.slot_mapping, -1)
        fill(self.seq_lens, packed.seq_lens, 0)
        width = packed.block_tables.shape[1]
        self.block_tables[:n, :width].copy_(torch.from_numpy(packed.block_tables[:n]).to(device))
        self.query_start_loc[:n + 1].copy_(torch.from_numpy(packed.query_start_loc[:n + 1])
                                           .to(device))
        self.query_start_loc[n + 1:size + 1].fill_(n)
        self.graphs[size].replay()
        self.replays += 1
        return self.outputs[size][:n]
