"""``SchedulerConfig``: how much work a step takes, and in which order requests start."""
from __future__ import annotations

from dataclasses import dataclass

from .setting_values import check_choice, check_non_negative, check_positive

_SCHEDULING_POLICIES = ("fcfs", "priority")


@dataclass
class SchedulerConfig:
    """A step runs at most ``max_num_seqs`` sequences and ``max_num_batched_tokens`` tokens.

    ``long_prefill_token_threshold`` and ``max_num_partial_prefills`` bound how much prompt
    work a step that carries decodes may take (so long prompts arriving under load stall
    running streams by at most one such step; see ``paged_core.core.scheduler``); 0
    disables either. ``itl_target_ms`` bounds such steps by time instead: they take only
    as much prompt work as the measured step cost predicts fits in that many milliseconds
    (9 steps in 10), and long prompts start only while the running ones' decodes fit in it
    (short ones while fewer than 16 run; see ``paged_core.core.step_cost``) (``None``: the
    usage default, ``SERVING_ITL_TARGET_MS`` for ``AsyncEngine`` servers, off for the
    offline ``LLM``; 0: off).

    ``scheduling_policy`` is vLLM's: ``"fcfs"`` or ``"priority"`` (lower ``priority``
    first, FCFS within a level); ``tenant_fairness`` makes the tenants (the OpenAI
    ``user`` field) of one level take turns at admission.

    ``async_scheduling`` (vLLM's name) overlaps the host with the GPU: the front end turns
    one step's tokens into text while the GPU runs the next (``LLMEngine``), and the
    runner's input copies do not wait for the kernels queued before them; outputs come one
    step later, and a stop string ends its sample one (dropped) token late. ``None`` (the
    default, as in vLLM) turns it on for a CUDA device and off on the CPU, where the forward
    runs on the host's own cores and there is nothing to overlap, and for tensor parallelism
    (``resolved_async_scheduling``).
    """

    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    long_prefill_token_threshold: int = 0
    max_num_partial_prefills: int = 0
    itl_target_ms: float | None = None
    scheduling_policy: str = "fcfs"
    tenant_fairness: bool = False
    async_scheduling: bool | None = None

    def __post_init__(self) -> None:
        check_positive("max_num_seqs", self.max_num_seqs)
        check_positive("max_num_batched_tokens", self.max_num_batched_tokens)
        check_non_negative("long_prefill_token_threshold", self.long_prefill_token_threshold)
        check_non_negative("max_num_partial_prefills", self.max_num_partial_prefills)
        if self.itl_target_ms is not None and not (
                isinstance(self.itl_target_ms, (int, float)) and 0 <= self.itl_target_ms < 1e6):
            raise ValueError(f"itl_target_ms must be a number of milliseconds >= 0 (0 disables "
                             f"it), got {self.itl_target_ms!r}")
        check_choice("scheduling_policy", self.scheduling_policy, _SCHEDULING_POLICIES)
        if self.async_scheduling is not None and not isinstance(self.async_scheduling, bool):
            raise ValueError(f"async_scheduling must be true or false (or None: on for CUDA), "
                             f"got {self.async_scheduling!r}")


def resolved_async_scheduling(setting: bool | None, device_type: str, tp_size: int) -> bool:
    """``async_scheduling`` for an engine on ``device_type`` over ``tp_size`` ranks: the
    setting, or for ``None`` on for one CUDA device (proven token for token and timed on an
    H200) and off elsewhere (the CPU; tensor parallelism, not yet run on GPUs)."""
    return (device_type == "cuda" and tp_size == 1) if setting is None else setting


# ``itl_target_ms`` of servers (``AsyncEngine``) that leave it unset: streams keep ticking
# under bursts of long prompts; offline batch work (``LLM``) favours throughput instead.
SERVING_ITL_TARGET_MS = 150.0
