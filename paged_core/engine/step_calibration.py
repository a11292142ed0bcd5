"""Calibrating a server's step-cost model before its first request.

A server's latency target (``StepPacer``) sizes steps by what they cost (``StepCostModel``),
learnt from the steps it runs. Learnt from nothing, its first fit rests on the first steps of
the first burst, which run while the HTTP front end takes that burst in on the same cores:
slow for their size, and all small. The fit then overstates a token's cost many times, the
budget it gives keeps steps small, and small steps never show it otherwise: a fresh server's
burst of 100 requests on 2 cores had a TTFT p99 of 3.4-5.1 s in 2 runs of 5, against
1.7-1.9 s once the fit was right. So the engine first times a few steps of known shape on a
quiet machine (one decode, a batch of decodes, prompts of a few hundred tokens and of the
step's token budget) and gives them to the model as its first observations
(``StepPacer.calibrate``; the model of an OpenMP team size met later starts from them too,
scaled): its fit spans the rows a server's steps span from the start, and later steps refine
it as before.

Only CPU engines calibrate: there the forward shares its cores with the HTTP front end; on
a GPU it does not (and code that only CUDA runs waits for a GPU run to prove it).

Invariants: calibration runs before the first request, while every block is free, and
touches no scheduler or KV-manager state: no block is allocated, cached or evicted and no
KV event goes out. Its steps map every token to block 0 (the C++ decoder stack reads a
prompt's keys back from its slots, so they must be real slots): they leave block 0 holding
stale rows, as any freed block does, which no sequence reads before it writes them. Their
logits are computed and dropped (nothing is sampled). Every shape runs once a round, for
``ROUNDS`` rounds, and its fastest time counts: the first round also builds what a shape
needs once (oneDNN's per-row-count kernels), which a server's first steps would otherwise
pay. Every shape stays within ``max_num_batched_tokens``, ``max_num_seqs`` and
``max_model_len``. (SmolLM2-135M in bf16 on 2 cores of an Intel Xeon with AMX: ~0.4 s.)
"""
from __future__ import annotations

import time
from typing import Callable

from ..core.step_pacer import Step
from ..executor.packed_batch import PackedBatch, StepInput, pack_batch

DECODE_CONTEXT = 128  # the context of each decode in the batched-decode shape
DECODE_BATCH = 16  # sequences of the batched-decode shape
PROMPT_CHUNK = 256  # a prompt shape's tokens are sequences of at most this many
LARGEST_PROMPT_STEP = 1024  # the prompt shapes: PROMPT_CHUNK tokens and up to this many
ROUNDS = 2


def calibration_shapes(max_num_seqs: int, max_num_batched_tokens: int,
                       max_model_len: int) -> list[list[tuple[int, int]]]:
    """The steps to time, each a list of ``(new tokens, context)`` per sequence: one decode,
    a batch of decodes, and two prompt steps (one chunk, then the largest step allowed)."""
    decode_context = min(DECODE_CONTEXT, max_model_len)
    decodes = min(DECODE_BATCH, max_num_seqs, max_num_batched_tokens)
    chunk = min(PROMPT_CHUNK, max_model_len, max_num_batched_tokens)
    largest = min(LARGEST_PROMPT_STEP, max_num_batched_tokens, chunk * max_num_seqs)
    shapes = [[(1, 1)], [(1, decode_context)] * decodes, [(chunk, chunk)]]
    if largest > chunk:
        full, rest = divmod(largest, chunk)
        shapes.append([(chunk, chunk)] * full + ([(rest, rest)] if rest else []))
    return shapes


def calibration_batch(shape: list[tuple[int, int]], block_size: int, bucketed: bool) -> PackedBatch:
    """A step of ``shape`` (``(new tokens, context)`` per sequence) whose every block is block 0,
    padded as the engine's steps are (``bucketed``)."""
    inputs = [StepInput(token_ids=[0] * context, num_computed_tokens=context - new,
                        num_new_tokens=new, block_ids=[0] * -(-context // block_size),
                        needs_logits=True)
              for new, context in shape]
    return pack_batch(inputs, block_size, bucketed=bucketed)


def calibration_steps(run_step: Callable[[PackedBatch], None],
                      shapes: list[list[tuple[int, int]]], block_size: int,
                      bucketed: bool) -> list[Step]:
    """Time every one of ``shapes`` with ``run_step`` (the executor's forward, every rank),
    ``ROUNDS`` rounds over all of them: each shape's ``(sequences, tokens, fastest time)``."""
    batches = [calibration_batch(shape, block_size, bucketed) for shape in shapes]
    rounds = [[_timed(run_step, packed) for packed in batches]
              for _ in range(ROUNDS)]
    return [(len(shape), packed.num_tokens, min(times))
            for shape, packed, times in zip(shapes, batches, zip(*rounds))]


def _timed(run_step: Callable[[PackedBatch], None], packed: PackedBatch) -> float:
    start = time.perf_counter()
    run_step(packed)  # on the CPU the forward has ended when it returns
    return time.perf_counter() - start
