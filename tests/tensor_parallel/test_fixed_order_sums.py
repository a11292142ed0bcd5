"""Batch-invariant all-reduce: groups of 3+ ranks add the ranks' tensors in rank order, so an
element's sum does not depend on how big the tensor (the batch) is."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from paged_core.executor.group import TensorParallelGroup, free_port

SIZE = 3


def _rank_tensor(rank: int, rows: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(rank)
    return (torch.randn(rows, 64, generator=generator) * 10 ** rank).bfloat16()


def _expected(rows: int) -> torch.Tensor:
    total = _rank_tensor(0, rows)
    for rank in range(1, SIZE):
        total = total + _rank_tensor(rank, rows)
    return total


def _check_rank(rank: int, port: int, failures) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=SIZE)
    group = TensorParallelGroup(rank, SIZE, fixed_order_sums=True)
    try:
        for rows in (1, 5, 300):
            x = _rank_tensor(rank, rows)
            if not torch.equal(group.all_reduce(x), _expected(rows)):
                failures.put((rank, rows))
    finally:
        dist.destroy_process_group()


def test_every_rank_gets_the_rank_ordered_sum_at_every_size():
    context = mp.get_context("spawn")
    failures = context.Queue()
    mp.start_processes(_check_rank, args=(free_port(), failures), nprocs=SIZE,
                       start_method="spawn")
    assert failures.empty()
