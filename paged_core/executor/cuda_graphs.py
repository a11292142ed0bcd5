"""``StepGraphs``: the model's forward captured as CUDA graphs, one per padded step size.

A step launches a few hundred small kernels; replaying a captured graph launches them as
one. Graphs are captured once, after the KV cache exists, with vLLM's ``cudagraph_mode``:

- ``FULL_DECODE_ONLY``: decode steps (every sequence adds one token), for the padded batch
  sizes ``capture_sizes`` (1, 2, 4, 8, then every 8 up to ``max_num_seqs``, at most
  ``max_cudagraph_capture_size``), with the attention kernel's decode tiles;
- ``FULL``: those, and every other step of at most ``max_cudagraph_capture_size`` tokens
  (prefill chunks beside decodes, speculative verification), for the padded token counts
  ``mixed_capture_sizes`` (``bucketed_num_tokens``'s sizes), each with room for
  ``min(tokens, max_num_seqs)`` sequences, with the attention kernel's prefill tiles.

A step replays the smallest graph of its kind that holds it; the others run eagerly.

Invariants:
- every graph reads its inputs from the same static buffers (``input_ids``,
  ``rope_rows``, ``slot_mapping``, ``block_tables``, ``seq_lens``,
  ``query_start_loc``); ``run`` copies a step into them before replaying;
- padding rows have token 0, rotary row 0 and slot -1 (no K/V is stored); padding
  sequences have no new token (``query_start_loc`` repeats the last real offset,
  ``seq_lens`` 0): the attention kernels skip them; padding rows' outputs are
  unspecified and never read;
- the kernels were captured with ``max_seq_len`` = ``max_model_len`` as their tuning hint
  (and, for mixed steps, ``max_query_len`` = the graph's rows), so a captured launch grid
  serves any context length and any split of its rows into sequences;
- only the decoder runs in the graph: the LM head runs eagerly on the rows
  sampled, so a graph's memory is one step's activations (from one shared pool).
"""
from __future__ import annotations

import logging

import torch

from ..attention import AttentionBackend, AttentionMetadata
from .packed_batch import PackedBatch, bucketed_num_tokens

logger = logging.getLogger("paged_core.cuda_graphs")


def capture_sizes(max_num_seqs: int, max_capture_size: int) -> list[int]:
    """Decode batch sizes to capture: 1, 2, 4, 8, then multiples of 8 up to ``max_num_seqs``
    (capped at ``max_capture_size``), always including the cap itself."""
    cap = min(max_num_seqs, max_capture_size)
    sizes = [s for s in (1, 2, 4) if s < cap] + list(range(8, cap + 1, 8))
    if not sizes or sizes[-1] != cap:
        sizes.append(cap)
    return sizes


def mixed_capture_sizes(max_tokens: int) -> list[int]:
    """Token counts to capture for steps other than pure decode: every padded size
    ``bucketed_num_tokens`` gives from 2 tokens up to ``max_tokens`` (which it rounds up)."""
    if max_tokens < 2:
        return []
    return sorted({bucketed_num_tokens(n) for n in range(2, max_tokens + 1)})


class StepGraphs:
    """Captured forwards of ``model`` over ``kv_caches`` (see the module docstring): decode
    steps of up to ``max_capture_size`` sequences, other steps of up to ``max_mixed_tokens``
    tokens (0: decode steps only)."""

    def __init__(self, model, backend: AttentionBackend,
                 kv_caches: list[tuple[torch.Tensor, torch.Tensor]], max_num_seqs: int,
                 max_model_len: int, block_size: int, device: torch.device,
                 max_capture_size: int, max_mixed_tokens: int = 0) -> None:
        self.model, self.backend, self.kv_caches = model, backend, kv_caches
        self.sizes = capture_sizes(max_num_seqs, max_capture_size)
        self.mixed_sizes = mixed_capture_sizes(max_mixed_tokens)
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        rows = max([self.sizes[-1], *self.mixed_sizes])
        seqs = max(self.sizes[-1], self._mixed_seqs(rows) if self.mixed_sizes else 0)
        width = -(-max_model_len // block_size)
        self.input_ids = torch.zeros(rows, dtype=torch.int64, device=device)
        self.rope_rows = torch.zeros(rows, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((rows,), -1, dtype=torch.int64, device=device)
        self.block_tables = torch.zeros(seqs, width, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(seqs, dtype=torch.int32, device=device)
        self.query_start_loc = torch.zeros(seqs + 1, dtype=torch.int32, device=device)
        self.graphs: dict[tuple[bool, int], torch.cuda.CUDAGraph] = {}  # (mixed, rows)
        self.outputs: dict[tuple[bool, int], torch.Tensor] = {}
        self.pool_bytes = 0
        self.replays = 0  # decode steps served by a graph
        self.mixed_replays = 0  # other steps served by a graph

    def _mixed_seqs(self, rows: int) -> int:
        """Sequences a mixed graph of ``rows`` tokens has room for."""
        return min(rows, self.max_num_seqs)

    def _meta(self, mixed: bool, rows: int) -> AttentionMetadata:
        """The metadata a graph is captured with; its host lists describe the dummy step."""
        seqs = self._mixed_seqs(rows) if mixed else rows
        lens = [rows] + [0] * (seqs - 1) if mixed else [1] * seqs
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:rows], block_tables=self.block_tables[:seqs],
            seq_lens=self.seq_lens[:seqs], query_start_loc=self.query_start_loc[:seqs + 1],
            max_query_len=rows if mixed else 1, max_seq_len=self.max_model_len,
            seq_lens_cpu=lens, query_lens_cpu=list(lens))

    def _forward(self, mixed: bool, rows: int) -> torch.Tensor:
        return self.model(self.input_ids[:rows], self.rope_rows[:rows], self.kv_caches,
                          self._meta(mixed, rows), self.backend)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size, largest first (the smaller ones reuse its pool's memory).
        The dummy steps store nothing (slots -1) and read keys of block 0 only."""
        keys = sorted([(True, rows) for rows in self.mixed_sizes]
                      + [(False, rows) for rows in self.sizes], key=lambda k: -k[1])
        before = torch.cuda.memory_reserved()
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for mixed, rows in keys:
                self._dummy_step(mixed, rows)
                self._forward(mixed, rows)  # warm-up: compiles kernels, sets up library handles
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    self.outputs[mixed, rows] = self._forward(mixed, rows)
                self.graphs[mixed, rows] = graph
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        self.pool_bytes = torch.cuda.memory_reserved() - before
        logger.info("captured CUDA graphs for %d decode batch sizes (%s) and %d other step sizes "
                    "(up to %d tokens) in %.1f MiB", len(self.sizes), self.sizes,
                    len(self.mixed_sizes), max(self.mixed_sizes, default=0),
                    self.pool_bytes / 2**20)

    def _dummy_step(self, mixed: bool, rows: int) -> None:
        """Decode: one token per sequence; mixed: every row a token of the first sequence."""
        self.slot_mapping.fill_(-1)
        self.block_tables.zero_()
        if mixed:
            self.seq_lens.zero_()
            self.seq_lens[0] = rows
            self.query_start_loc.fill_(rows)
            self.query_start_loc[0] = 0
        else:
            self.seq_lens.fill_(1)
            self.query_start_loc.copy_(torch.arange(self.query_start_loc.shape[0],
                                                    dtype=torch.int32))

    def graph_for(self, packed: PackedBatch) -> tuple[bool, int] | None:
        """The key of the graph that runs ``packed``, or None (it runs eagerly)."""
        if packed.block_tables.shape[1] > self.block_tables.shape[1]:
            return None
        if packed.is_decode_only:
            if packed.num_seqs <= self.sizes[-1]:
                return False, next(s for s in self.sizes if s >= packed.num_seqs)
        if not self.mixed_sizes or packed.num_tokens > self.mixed_sizes[-1]:
            return None
        rows = next(s for s in self.mixed_sizes if s >= packed.num_tokens)
        return (True, rows) if packed.num_seqs <= self._mixed_seqs(rows) else None

    def run(self, packed: PackedBatch) -> torch.Tensor | None:
        """Replay the graph for ``packed``; returns the hidden states of its ``num_tokens`` rows
        (a view of the graph's output: read it before the next replay), or None when no graph
        holds the step (the caller runs it eagerly)."""
        key = self.graph_for(packed)
        if key is None:
            return None
        mixed, rows = key
        n, s = packed.num_tokens, packed.num_seqs
        seqs = self._mixed_seqs(rows) if mixed else rows
        device = self.input_ids.device

        def fill(buffer: torch.Tensor, values, count: int, size: int, pad) -> None:
            buffer[:count].copy_(torch.from_numpy(values[:count]).to(device, non_blocking=True))
            buffer[count:size].fill_(pad)

        fill(self.input_ids, packed.input_ids, n, rows, 0)
        if packed.ahead is not None:
            packed.ahead.write_into(self.input_ids)
        fill(self.rope_rows, packed.rope_rows, n, rows, 0)
        fill(self.slot_mapping, packed.slot_mapping, n, rows, -1)
        fill(self.seq_lens, packed.seq_lens, s, seqs, 0)
        fill(self.query_start_loc, packed.query_start_loc, s + 1, seqs + 1, n)
        width = packed.block_tables.shape[1]
        self.block_tables[:s, :width].copy_(torch.from_numpy(packed.block_tables[:s]).to(device))
        self.graphs[mixed, rows].replay()
        if mixed:
            self.mixed_replays += 1
        else:
            self.replays += 1
        return self.outputs[mixed, rows][:n]
