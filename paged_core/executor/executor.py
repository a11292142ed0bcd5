"""Executors: how the engine runs a step's forward (vLLM's ``Executor`` seam).

The engine schedules, packs the step into a ``PackedBatch``, lays out its sampling
(``SamplingPlan``), calls ``execute_model(packed, block_copies, plan)`` and gets the sampled
tokens back (``SamplerOutput``).
Which processes do the forward is the executor's business:

- ``UniProcExecutor`` (``tensor_parallel_size=1``): one ``Worker`` in this process.
- ``MultiprocExecutor`` (``"mp"``): this process is rank 0 (the driver) and
  starts ``tensor_parallel_size - 1`` worker processes on this machine, each a
  fresh interpreter that never imports the user's ``__main__`` (see ``launch``);
  they meet over ``torch.distributed`` on a free port of 127.0.0.1.
- ``ExternalLauncherExecutor`` (``"external_launcher"``): ``torchrun`` started
  every rank (on one machine or several) with the same command; rank 0 becomes
  the driver and returns, every other rank serves steps inside the constructor
  and then exits the process (see ``paged_core.worker``).

Per step the driver broadcasts the packed batch once (a pickled object: token
ids, positions, slots, block tables, copies), every rank runs its shard, and
the logits are gathered to rank 0, the only rank that samples (its ``Worker`` runs the
plan; the plan never travels: its rows hold generators and grammar matchers).

Failure: ``check_health`` raises ``WorkerDiedError`` once a worker process has
exited (a watchdog thread notices within a second, and logs it); a collective
with a dead peer fails at once, so a step in flight raises too.
"""
from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from typing import NoReturn

import torch
import torch.distributed as dist

from ..cpu.adaptive_threads import AdaptiveThreads, adaptive_threads_enabled
from ..sample.sampling_plan import SamplerOutput, SamplingPlan
from .packed_batch import PackedBatch
from .group import SINGLE, free_port, init_process_group
from .launch import start_worker
from .rank_worker import RankSpec, Worker, broadcast_step, for_rank, run_rank, threads_per_rank

logger = logging.getLogger("paged_core.executor")


class WorkerDiedError(RuntimeError):
    """A tensor-parallel worker process exited while the engine was running."""


class UniProcExecutor:
    """Rank 0 of a group of one: the forward runs in this process. On the CPU each step runs
    with its OpenMP team sized to the cores other processes leave free (``adaptive_threads``;
    not in batch-invariant mode, which keeps the caller's team)."""

    def __init__(self, spec: RankSpec) -> None:
        adaptive = (spec.device.type == "cpu" and not spec.config.batch_invariant
                    and adaptive_threads_enabled())
        self.worker = Worker(spec, SINGLE)
        self.threads = AdaptiveThreads() if adaptive else None
        self.last_team: int | None = None  # the adaptive team of the last step (None: fixed)

    @property
    def runner(self):
        """Rank 0's ``ModelRunner`` (its model holds rank 0's shard)."""
        return self.worker.runner

    @property
    def num_blocks(self) -> int:
        return self.worker.num_blocks

    @property
    def attention_backend(self) -> str:
        """The attention backend's name (``cpu``, ``torch``, ``triton``)."""
        return self.worker.runner.backend.name

    @property
    def prefers_bucketed_batches(self) -> bool:
        """Whether the model pads a step's token rows to buckets (``pack_batch``)."""
        return self.worker.runner.model.prefers_bucketed_batches

    def execute_model(self, packed: PackedBatch, block_copies: list[tuple[int, int]],
                      plan: SamplingPlan | None) -> SamplerOutput | None:
        """Run the step on every rank and sample it with ``plan`` (``None``: the forward only,
        nothing sampled or returned: the engine's start-up calibration)."""
        with self.threads.sized_team() if self.threads else contextlib.nullcontext() as team:
            self.last_team = team
            return self.worker.execute_model(packed, block_copies, plan)

    def next_team(self) -> int | None:
        """The OpenMP team the next step will run with, after a look at the free cores
        (``AdaptiveThreads.update``, at most one a window), so that what schedules the step
        can size it for that team; between requests it keeps the look current, so the next
        step starts with a team that fits (None: a fixed team)."""
        if not self.threads:
            return None
        ceiling = torch.get_num_threads()
        self.threads.update(ceiling)
        return self.threads.team(ceiling)

    def check_health(self) -> None:
        """Raises if the executor can no longer run steps."""

    def shutdown(self) -> None:
        """Release every process and resource the executor holds (idempotent)."""


class _DriverExecutor(UniProcExecutor):
    """Rank 0 of a larger group: broadcasts each step, then runs its own shard."""

    def __init__(self, spec: RankSpec, size: int, init_method: str) -> None:
        self.size = size
        self._closed = False
        self.threads, self.last_team = None, None  # ranks keep fixed teams
        torch.set_num_threads(threads_per_rank(size))
        spec = for_rank(spec, 0)
        tp = init_process_group(0, size, spec.device, init_method)
        try:
            self.worker = Worker(spec, tp)
        except BaseException:
            _destroy_group()  # so that a later engine in this process can start
            raise

    def execute_model(self, packed: PackedBatch, block_copies: list[tuple[int, int]],
                      plan: SamplingPlan | None) -> SamplerOutput | None:
        self.check_health()
        broadcast_step(self.worker.tp, (packed, block_copies))
        return self.worker.execute_model(packed, block_copies, plan)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._workers_alive():
                broadcast_step(self.worker.tp, None)
        finally:
            _destroy_group()

    def _workers_alive(self) -> bool:
        return True


class MultiprocExecutor(_DriverExecutor):
    """Rank 0 here; ranks 1 .. size-1 are worker processes on this machine (``launch``)."""

    def __init__(self, spec: RankSpec, size: int) -> None:
        init_method = f"tcp://127.0.0.1:{free_port()}"
        self.processes: list[subprocess.Popen] = []
        self.failure: str | None = None
        self._stopping = threading.Event()
        try:
            for rank in range(1, size):
                self.processes.append(start_worker(spec, rank, size, init_method))
            threading.Thread(target=self._watch_workers, name="paged-core-tp-watchdog",
                             daemon=True).start()
            super().__init__(spec, size, init_method)
        except BaseException:
            self._reap()
            raise

    @property
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def check_health(self) -> None:
        if self.failure is not None:
            raise WorkerDiedError(self.failure)

    def shutdown(self) -> None:
        self._stopping.set()
        try:
            super().shutdown()
        finally:
            self._reap()

    def _workers_alive(self) -> bool:
        return self.failure is None and all(p.poll() is None for p in self.processes)

    def _watch_workers(self, interval_s: float = 0.2) -> None:
        """Record and log the first worker exit that ``shutdown`` did not ask for."""
        while not self._stopping.wait(interval_s):
            for rank, process in enumerate(self.processes, start=1):
                # _stopping is set before shutdown stops any worker, so check it after poll()
                if process.poll() is not None and not self._stopping.is_set():
                    self.failure = (f"tensor-parallel worker rank {rank} (pid {process.pid}) "
                                    f"exited with code {process.returncode}; see its traceback "
                                    f"in the log above")
                    logger.error(self.failure)
                    return

    def _reap(self, grace_s: float = 5.0) -> None:
        """Wait for every worker to exit; kill any still running after ``grace_s``."""
        deadline = time.monotonic() + grace_s
        for process in self.processes:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class ExternalLauncherExecutor(_DriverExecutor):
    """``torchrun`` started every rank: rank 0 drives; any other rank serves and exits here."""

    def __init__(self, spec: RankSpec, size: int) -> None:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if world != size:
            raise ValueError(
                f"torchrun started WORLD_SIZE={world} processes but tensor_parallel_size={size}; "
                f"give --tensor-parallel-size {world} (one rank per device)")
        if rank != 0:
            torch.set_num_threads(threads_per_rank(size))
            run_rank(spec, rank, size, "env://")
            exit_torchrun_rank(0)
        super().__init__(spec, size, "env://")


def exit_torchrun_rank(code: int) -> NoReturn:
    """End a torchrun rank whose work is done (output flushed) without interpreter teardown:
    torch.distributed's C++ objects can abort the process from their destructors at exit
    ("terminate called without an active exception", SIGABRT; seen in ~1 of 4 runs of two
    torchrun nodes on a loaded 2-core machine, always after the rank had finished)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _destroy_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def launched_by_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


def make_executor(spec: RankSpec, size: int, backend: str | None):
    """The executor for ``distributed_executor_backend`` (``None``: ``external_launcher``
    under torchrun, else ``uni`` for one rank and ``mp`` for more)."""
    if backend is None:
        backend = "external_launcher" if launched_by_torchrun() else ("uni" if size == 1 else "mp")
    if backend != "uni" and dist.is_initialized():  # checked before any worker is started
        raise RuntimeError(
            "another tensor-parallel engine is running in this process; shut it down "
            "first (LLM.shutdown() / AsyncEngine.shutdown())")
    if backend == "uni":
        if size != 1:
            raise ValueError(f"distributed_executor_backend='uni' runs one rank; "
                             f"tensor_parallel_size={size} needs 'mp' or 'external_launcher'")
        return UniProcExecutor(spec)
    if backend == "mp":
        return MultiprocExecutor(spec, size)
    return ExternalLauncherExecutor(spec, size)
