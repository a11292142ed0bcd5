"""``SchedulerConfig``: how much work a step takes, and in which order requests start."""
from __future__ import annotations

from dataclasses import dataclass

from .setting_values import check_choice, check_non_negative, check_positive

_SCHEDULING_POLICIES = ("fcfs", "priority")


@dataclass
class SchedulerConfig:
    """A step runs at most ``max_num_seqs`` sequences and ``max_num_batched_tokens`` tokens.
    ``None`` (the default) takes vLLM's default for the device and the usage
    (``batch_limits``): 128 / 2048 on the CPU; on a CUDA device of 70 GiB or more (an H100,
    an H200; not an A100) 1024 / 16384 for the offline ``LLM`` and 1024 / 8192 for servers;
    on smaller ones 256 / 8192 and 256 / 2048.

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

    ``schedule_ahead`` (with ``async_scheduling``, one rank, no speculative decoding) goes
    further, as vLLM's async scheduler does: each step is scheduled and launched before the
    previous step's sampled tokens reach the host; a decoding sequence holds a placeholder
    for its token in flight and the runner takes that token from the previous step's output
    on the device (``engine_core``). ``None`` (the default) turns it on wherever
    ``async_scheduling`` is on for one CUDA device without speculative decoding
    (``resolved_schedule_ahead``; proven token for token and timed on an H200), off elsewhere.
    """

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    long_prefill_token_threshold: int = 0
    max_num_partial_prefills: int = 0
    itl_target_ms: float | None = None
    scheduling_policy: str = "fcfs"
    tenant_fairness: bool = False
    async_scheduling: bool | None = None
    schedule_ahead: bool | None = None

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name))
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
        if self.schedule_ahead is not None and not isinstance(self.schedule_ahead, bool):
            raise ValueError(f"schedule_ahead must be true or false (or None: on for one CUDA "
                             f"device), got {self.schedule_ahead!r}")


def resolved_async_scheduling(setting: bool | None, device_type: str, tp_size: int) -> bool:
    """``async_scheduling`` for an engine on ``device_type`` over ``tp_size`` ranks: the
    setting, or for ``None`` on for one CUDA device (proven token for token and timed on an
    H200) and off elsewhere (the CPU; tensor parallelism, not yet run on GPUs)."""
    return (device_type == "cuda" and tp_size == 1) if setting is None else setting


def resolved_schedule_ahead(setting: bool | None, device_type: str, async_scheduling: bool,
                            tp_size: int, speculative: bool) -> bool:
    """``schedule_ahead`` for an engine whose ``async_scheduling`` is resolved: the setting,
    or for ``None`` on for one CUDA device that overlaps its steps without speculative
    decoding (proven token for token on an H200 with every family and feature, and faster at
    every decode batch timed there), off elsewhere (the CPU gains nothing from it)."""
    if setting is None:
        return (device_type == "cuda" and async_scheduling and tp_size == 1
                and not speculative)
    return setting


# vLLM's step limits by device, (max_num_seqs, max_num_batched_tokens) for the offline
# ``LLM`` and for servers: large GPUs (70 GiB or more, not an A100, where vLLM measured
# large steps to lose) take wide steps; the CPU keeps steps its two to few dozen cores finish
# within an inter-token budget.
_CPU_LIMITS = {"llm": (128, 2048), "server": (128, 2048)}
_LARGE_GPU_LIMITS = {"llm": (1024, 16384), "server": (1024, 8192)}
_GPU_LIMITS = {"llm": (256, 8192), "server": (256, 2048)}
_LARGE_GPU_BYTES = 70 << 30


def batch_limits(device_type: str, memory_bytes: int, device_name: str,
                 usage: str) -> tuple[int, int]:
    """The default ``(max_num_seqs, max_num_batched_tokens)`` of an engine on a device of
    ``device_type`` with ``memory_bytes`` of memory named ``device_name``, used offline
    (``usage="llm"``) or by a server (``"server"``)."""
    if device_type != "cuda":
        return _CPU_LIMITS[usage]
    large = memory_bytes >= _LARGE_GPU_BYTES and "a100" not in device_name.lower()
    return (_LARGE_GPU_LIMITS if large else _GPU_LIMITS)[usage]


# ``itl_target_ms`` of servers (``AsyncEngine``) that leave it unset: streams keep ticking
# under bursts of long prompts; offline batch work (``LLM``) favours throughput instead.
SERVING_ITL_TARGET_MS = 150.0
