"""Instruments for ``bench tp``: bytes a rank holds, and time spent inside collectives.

- ``model_bytes`` (``model_bytes.py``) counts every weight tensor a model holds
  (parameters and the prepacked oneDNN copies of ``cpu_linear``), each storage once.
- ``rank_memory`` builds every rank's shard in this process (``load_model``
  with ``TensorParallelGroup(rank, size)``: loading runs no collective) and
  counts its weights and KV cache, so ranks 1..N-1, which live in other
  processes, are measured too, not assumed.
- ``CollectiveTimer`` wraps, in this process only, the three places the driver
  communicates during a step: ``TensorParallelGroup.all_reduce`` (row-parallel
  outputs, embedding rows), ``TensorParallelGroup.gather_to_driver`` (logits)
  and the executor's ``broadcast_step`` (the pickled ``PackedBatch``). The time
  it reports is wall time rank 0 spends inside them: the transfer over gloo
  *and* waiting for slower ranks to arrive (so it also absorbs load imbalance
  between ranks that share cores). Workers are not instrumented; by
  construction they run the same collectives in the same order.
"""
from __future__ import annotations

import contextlib
import functools
import time
from typing import Any, Callable, Iterator

import torch

from ..executor import executor as executor_module
from ..executor.group import TensorParallelGroup
from ..models.model_loader import load_hf_config, load_model
from ..executor.model_runner import kv_cache_bytes_per_block
from .model_bytes import model_bytes

# (owner, attribute) of every collective the driver calls during a step.
_COLLECTIVES = ((TensorParallelGroup, "all_reduce"), (TensorParallelGroup, "gather_to_driver"),
                (executor_module, "broadcast_step"))


def rank_memory(folder: str, dtype: torch.dtype, size: int, block_size: int,
                num_blocks: int, max_model_len: int) -> list[dict[str, int]]:
    """Weight and KV-cache bytes of each rank 0..size-1, from shards built here one at a time."""
    hf_config = load_hf_config(folder)
    ranks = []
    for rank in range(size):
        model = load_model(folder, hf_config, max_model_len, dtype, torch.device("cpu"),
                           TensorParallelGroup(rank, size))
        ranks.append({"weight_bytes": model_bytes(model),
                      "kv_cache_bytes": num_blocks * kv_cache_bytes_per_block(model, block_size,
                                                                              dtype)})
        del model
    return ranks


class CollectiveTimer:
    """Seconds the driver spends inside collectives while ``installed()`` is active."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def _wrap(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1
        return timed

    @contextlib.contextmanager
    def installed(self) -> Iterator["CollectiveTimer"]:
        """Wrap the collectives (in this process), restoring the originals on exit."""
        originals = [(owner, name, getattr(owner, name)) for owner, name in _COLLECTIVES]
        for owner, name, fn in originals:
            setattr(owner, name, self._wrap(fn))
        try:
            yield self
        finally:
            for owner, name, fn in originals:
                setattr(owner, name, fn)

    def time_step(self, step: Callable[[], Any]) -> tuple[float, float, Any]:
        """Run ``step()``; returns (wall seconds, seconds inside collectives, its result)."""
        before = self.seconds
        start = time.perf_counter()
        result = step()
        return time.perf_counter() - start, self.seconds - before, result
