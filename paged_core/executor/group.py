"""``TensorParallelGroup``: one rank's place in a tensor-parallel group and its collectives.

Rank 0 is the driver: the engine's process, which schedules, broadcasts each
step and samples. Collectives go through ``torch.distributed`` (gloo on CPU,
NCCL on CUDA). A group of size 1 makes every collective a no-op, so the model
code is the same with and without tensor parallelism.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

# A peer that stops answering (hung, not dead: a dead peer closes its sockets and
# fails the collective at once) fails the step after this long, once every rank has loaded.
COLLECTIVE_TIMEOUT = timedelta(seconds=int(os.environ.get("PAGED_CORE_COLLECTIVE_TIMEOUT", "120")))
# Until then ranks wait this long for each other: one may load its weights (or build the C++
# kernels, or wait for another process building them) minutes after the others.
STARTUP_TIMEOUT = timedelta(seconds=int(os.environ.get("PAGED_CORE_STARTUP_TIMEOUT", "1800")))


@dataclass(frozen=True)
class TensorParallelGroup:
    """``fixed_order_sums``: ``all_reduce`` adds the ranks' tensors in rank order on every
    rank (an all-gather, then a local sum), so each element's sum does not depend on how
    the collective chunks the tensor, i.e. on the batch size (batch-invariant mode; a sum of
    two is the same either way, so only groups of 3+ ranks pay for it)."""

    rank: int = 0
    size: int = 1
    fixed_order_sums: bool = False

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place."""
        if self.size > 2 and self.fixed_order_sums:
            parts = [torch.empty_like(x) for _ in range(self.size)]
            dist.all_gather(parts, x.contiguous())
            total = parts[0]
            for part in parts[1:]:
                total += part
            x.copy_(total)
        elif self.size > 1:
            dist.all_reduce(x)
        return x

    def gather_to_driver(self, x: torch.Tensor) -> torch.Tensor | None:
        """Concatenate every rank's ``x`` along the last dimension on rank 0 (``None`` elsewhere)."""
        if self.size == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)] if self.is_driver else None
        dist.gather(x, parts, dst=0)
        return torch.cat(parts, dim=-1) if self.is_driver else None


SINGLE = TensorParallelGroup()


def collective_backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_process_group(rank: int, size: int, device: torch.device,
                       init_method: str = "env://") -> TensorParallelGroup:
    """Join the group (every rank calls this; it returns once all ``size`` ranks have)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(collective_backend(device), init_method=init_method, rank=rank,
                            world_size=size, timeout=STARTUP_TIMEOUT)
    return TensorParallelGroup(rank, size)


def all_ranks_loaded(tp: TensorParallelGroup) -> None:
    """Every rank calls this once its model and KV cache are ready: it returns when all have
    (waiting up to ``STARTUP_TIMEOUT``), and from then on a silent peer fails a collective
    after ``COLLECTIVE_TIMEOUT``."""
    if tp.size == 1:
        return
    dist.barrier()
    # private but kept (torch.distributed's own tests use it): the group's timeout, reset
    dist.distributed_c10d._set_pg_timeout(COLLECTIVE_TIMEOUT)


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Rank ``rank``'s device: ``cuda:<local rank>`` on GPUs, the CPU otherwise."""
    if device.type != "cuda":
        return device
    local = int(os.environ.get("LOCAL_RANK", rank))
    return torch.device("cuda", local)
