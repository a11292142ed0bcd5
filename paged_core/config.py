"""``EngineConfig``: the one typed configuration shared by the engine and every adapter.

Built from keyword arguments or from ``PAGED_CORE_*`` environment variables
(``EngineConfig.from_env()``). Every bad setting fails at construction with a
``ValueError`` that names the setting and says what to change.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from .spec_decode.config import SpeculativeConfig

_DTYPES = ("auto", "float32", "bfloat16", "float16")
_BACKENDS = ("auto", "torch", "triton")
_EXECUTOR_BACKENDS = (None, "uni", "mp", "external_launcher")
_TOOL_CALL_PARSERS = (None, "hermes", "llama3_json")  # None: chosen from the chat template
_SCHEDULING_POLICIES = ("fcfs", "priority")
_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6,
               "g": 10**9, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30,
               "tib": 2**40, "t": 10**12, "tb": 10**12}


def parse_size(value: int | str) -> int:
    """Parse a byte size such as ``1073741824``, ``"512MiB"`` or ``"2GB"``."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise ValueError(f"kv_cache_memory must be > 0 bytes, got {value}")
        return value
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(
            f"kv_cache_memory must be a byte count like '2GiB', '512MiB' or 1073741824, "
            f"got {value!r}")
    size = int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])
    if size <= 0:
        raise ValueError(f"kv_cache_memory must be > 0 bytes, got {value!r}")
    return size


@dataclass
class EngineConfig:
    """Everything needed to build an engine.

    ``model`` is a Hugging Face folder, a ``.gguf`` file, or ``None`` for the
    embedded SmolLM2-135M-Instruct. The KV cache is sized by ``num_kv_blocks``
    if given, else ``kv_cache_memory`` bytes, else (CUDA) a fraction
    ``gpu_memory_utilization`` of free device memory, else 1 GiB on CPU (per
    rank under tensor parallelism).

    ``tensor_parallel_size`` shards the model over that many ranks (processes,
    one device each); ``distributed_executor_backend`` says how they start:
    ``None`` (automatic), ``"uni"`` (one rank, in process), ``"mp"`` (spawned
    workers on this machine) or ``"external_launcher"`` (``torchrun`` started
    them, possibly on several machines; see ``paged_core.worker``).

    ``long_prefill_token_threshold`` and ``max_num_partial_prefills`` bound how
    much prompt work a step that carries decodes may take (so long prompts
    arriving under load stall running streams by at most one such step; see
    ``paged_core.core.scheduler``); 0 disables either. ``itl_target_ms`` bounds such
    steps by time instead: they take only as much prompt work as the measured
    step cost predicts fits in that many milliseconds (9 steps in 10), and long
    prompts start only while the running ones' decodes fit in it (short ones
    while fewer than 16 run; see ``paged_core.core.step_cost`` and
    ``paged_core.core.scheduler``) (``None``: the usage default,
    ``SERVING_ITL_TARGET_MS`` for ``AsyncEngine`` servers, off for the offline
    ``LLM``; 0: off).
    ``speculative_config`` turns on speculative decoding with vLLM's dict
    (``{"method": "ngram", "num_speculative_tokens": 4, ...}`` or ``{"model":
    draft_folder, "num_speculative_tokens": 4}``; also as JSON text), validated
    into a ``SpeculativeConfig``.

    Serving limits (``AsyncEngine`` only; the offline ``LLM`` never refuses):
    ``max_waiting_requests`` requests may wait for their first token at once
    (``None``: no limit); one more is refused with ``EngineOverloadedError``
    (HTTP 429). ``request_timeout`` is the default deadline of a request in
    seconds (``None``: none; a request's own ``timeout`` wins). On shutdown
    (SIGTERM) adapters drain: no new request, in-flight ones get up to
    ``drain_timeout`` seconds to finish, then are aborted with an error.
    ``scheduling_policy`` is vLLM's: ``"fcfs"`` or ``"priority"`` (lower
    ``priority`` first, FCFS within a level); ``tenant_fairness`` makes the
    tenants (the OpenAI ``user`` field) of one level take turns at admission.

    ``batch_invariant`` (vLLM's batch-invariant mode; default: the environment variable
    ``PAGED_CORE_BATCH_INVARIANT``, else off) makes a request's greedy tokens bit-identical
    whatever else shares its steps, at a speed cost (``models.batch_invariant``); CPU only,
    float32 or bfloat16.
    """

    model: str | None = None
    tokenizer: str | None = None
    served_model_name: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    block_size: int = 16
    kv_cache_memory: int | str | None = None
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float = 0.85
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    long_prefill_token_threshold: int = 0
    max_num_partial_prefills: int = 0
    itl_target_ms: float | None = None
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    attention_backend: str = "auto"
    seed: int = 0
    tensor_parallel_size: int = 1
    distributed_executor_backend: str | None = None
    tool_call_parser: str | None = None  # how chat replies with tool_choice "auto" are parsed
    speculative_config: dict | None = None  # vLLM's dict; becomes a SpeculativeConfig
    max_waiting_requests: int | None = None
    request_timeout: float | None = None
    drain_timeout: float = 20.0  # under the frameworks' 30 s grace periods
    scheduling_policy: str = "fcfs"
    tenant_fairness: bool = False
    batch_invariant: bool = field(default_factory=lambda: _env_flag("batch_invariant"))

    def __post_init__(self) -> None:
        self.speculative_config = SpeculativeConfig.from_value(self.speculative_config)
        if self.speculative_config and self.speculative_config.method == "draft_model" \
                and self.tensor_parallel_size > 1:
            raise ValueError("speculative_config with a draft model needs tensor_parallel_size=1; "
                             "use method 'ngram' with tensor parallelism")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, got {self.dtype!r}")
        if self.attention_backend not in _BACKENDS:
            raise ValueError(
                f"attention_backend must be one of {_BACKENDS}, got {self.attention_backend!r}")
        if self.block_size not in (8, 16, 32, 64, 128):
            raise ValueError(f"block_size must be one of 8, 16, 32, 64, 128, got {self.block_size}")
        _positive("max_num_seqs", self.max_num_seqs)
        _positive("max_num_batched_tokens", self.max_num_batched_tokens)
        _positive("tensor_parallel_size", self.tensor_parallel_size)
        _non_negative("long_prefill_token_threshold", self.long_prefill_token_threshold)
        _non_negative("max_num_partial_prefills", self.max_num_partial_prefills)
        if self.itl_target_ms is not None and not (
                isinstance(self.itl_target_ms, (int, float)) and 0 <= self.itl_target_ms < 1e6):
            raise ValueError(f"itl_target_ms must be a number of milliseconds >= 0 (0 disables "
                             f"it), got {self.itl_target_ms!r}")
        if self.distributed_executor_backend not in _EXECUTOR_BACKENDS:
            raise ValueError(f"distributed_executor_backend must be one of {_EXECUTOR_BACKENDS}, "
                             f"got {self.distributed_executor_backend!r}")
        if self.tool_call_parser not in _TOOL_CALL_PARSERS:
            raise ValueError(f"tool_call_parser must be one of {_TOOL_CALL_PARSERS}, "
                             f"got {self.tool_call_parser!r}")

        if self.max_waiting_requests is not None:
            _positive("max_waiting_requests", self.max_waiting_requests)
        if self.request_timeout is not None and not self.request_timeout > 0:
            raise ValueError(f"request_timeout must be > 0 seconds, got {self.request_timeout}")
        if not self.drain_timeout >= 0:
            raise ValueError(f"drain_timeout must be >= 0 seconds, got {self.drain_timeout}")
        if not isinstance(self.batch_invariant, bool):
            raise ValueError(f"batch_invariant must be true or false, got {self.batch_invariant!r}")
        if self.scheduling_policy not in _SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {_SCHEDULING_POLICIES}, "
                             f"got {self.scheduling_policy!r}")
        if self.num_kv_blocks is not None:
            _positive("num_kv_blocks", self.num_kv_blocks)
        if self.max_model_len is not None:
            _positive("max_model_len", self.max_model_len)
        if self.kv_cache_memory is not None:
            self.kv_cache_memory = parse_size(self.kv_cache_memory)
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.model is not None and not os.path.exists(self.model):
            raise ValueError(
                f"model {self.model!r} does not exist: give a Hugging Face model folder, "
                f"a .gguf file, or leave it unset for the embedded SmolLM2-135M-Instruct")

    @property
    def model_name(self) -> str:
        """The name clients use for this model (OpenAI ``model`` field)."""
        if self.served_model_name:
            return self.served_model_name
        if self.model is None:
            return "SmolLM2-135M-Instruct"
        return os.path.basename(os.path.normpath(self.model))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "EngineConfig":
        """Read ``PAGED_CORE_<FIELD>`` variables (e.g. ``PAGED_CORE_BLOCK_SIZE=32``).

        Keyword ``overrides`` win over the environment.
        """
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = environ.get(f"PAGED_CORE_{f.name.upper()}")
            if raw is not None and raw != "":
                values[f.name] = _convert(f.name, f.type, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @classmethod
    def from_strings(cls, values: Mapping[str, str]) -> "EngineConfig":
        """Build from string values (config files, CLI), converting each by its field type."""
        types = {f.name: f.type for f in fields(cls)}
        unknown = sorted(set(values) - set(types))
        if unknown:
            raise ValueError(f"unknown engine setting(s) {unknown}; allowed: {sorted(types)}")
        return cls(**{k: _convert(k, types[k], v) for k, v in values.items() if v != ""})


# ``itl_target_ms`` of servers (``AsyncEngine``) that leave it unset: streams keep ticking
# under bursts of long prompts; offline batch work (``LLM``) favours throughput instead.
SERVING_ITL_TARGET_MS = 150.0


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _non_negative(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0 (0 disables it), got {value!r}")


def _env_flag(name: str) -> bool:
    """The boolean setting ``PAGED_CORE_<NAME>`` from the environment (unset or empty: False)."""
    raw = os.environ.get(f"PAGED_CORE_{name.upper()}", "")
    return raw != "" and _convert(name, "bool", raw)


def _convert(name: str, type_name: Any, raw: str) -> Any:
    """Convert a string setting to the field's type, naming the setting on failure."""
    type_name = str(type_name)
    try:
        if type_name.startswith("bool"):
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if type_name.startswith("int | str"):
            return int(raw) if raw.isdigit() else raw
        if type_name.startswith("int"):
            return int(raw)
        if type_name.startswith("float"):
            return float(raw)
    except ValueError:
        raise ValueError(
            f"setting {name} (PAGED_CORE_{name.upper()}) must be a {type_name.split(' ')[0]}, "
            f"got {raw!r}") from None
    return raw
