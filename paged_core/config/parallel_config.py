"""``ParallelConfig``: how many ranks the model is sharded over, and how they start."""
from __future__ import annotations

from dataclasses import dataclass

from .setting_values import check_choice, check_positive

_EXECUTOR_BACKENDS = (None, "uni", "mp", "external_launcher")


@dataclass
class ParallelConfig:
    """``tensor_parallel_size`` shards the model over that many ranks (processes, one device
    each); ``distributed_executor_backend`` says how they start: ``None`` (automatic),
    ``"uni"`` (one rank, in process), ``"mp"`` (spawned workers on this machine) or
    ``"external_launcher"`` (``torchrun`` started them, possibly on several machines; see
    ``paged_core.worker``)."""

    tensor_parallel_size: int = 1
    distributed_executor_backend: str | None = None

    def __post_init__(self) -> None:
        check_positive("tensor_parallel_size", self.tensor_parallel_size)
        check_choice("distributed_executor_backend", self.distributed_executor_backend,
                     _EXECUTOR_BACKENDS)
