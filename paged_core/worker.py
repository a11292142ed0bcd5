"""``python -m paged_core.worker``: the ``torchrun`` entry point (multi-node tensor parallelism).

Every node runs the same command; ``torchrun`` gives each process its ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``::

    torchrun --nnodes 2 --nproc-per-node 1 --node-rank R --master-addr A --master-port P \\
        -m paged_core.worker serve --adapter litserve --tensor-parallel-size 2

The arguments are those of the ``paged-core`` command line (``generate``,
``serve``, ...). Rank 0 runs that command as the driver: it schedules, samples
and (for ``serve``) answers HTTP. Every other rank loads its shard, serves the
driver's steps and exits when the driver shuts down (see
``distributed.executor.ExternalLauncherExecutor``); they never start the command's
server. ``tensor_parallel_size``
must equal the number of processes torchrun starts.
"""
import os
import sys

from . import cli
from .executor.executor import exit_torchrun_rank, launched_by_torchrun


def main(argv: list[str] | None = None) -> int:
    """Rank 0: the ``paged-core`` command. Other ranks: only the engine, which serves rank 0's
    steps and exits the process when rank 0 shuts down (no server, no output of their own).
    Under torchrun every rank ends through ``exit_torchrun_rank`` (no interpreter teardown)."""
    if not launched_by_torchrun():
        return cli.main(argv)
    if int(os.environ["RANK"]) != 0:
        from .engine.llm_engine import LLMEngine

        LLMEngine(cli.engine_config(cli.build_parser().parse_args(argv)))  # never returns
    exit_torchrun_rank(cli.main(argv))


if __name__ == "__main__":
    sys.exit(main())
