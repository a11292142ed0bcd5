"""Which instruction-set paths paged-core's CPU code takes: detected, or forced by one setting.

The CPU paths form a ladder; each level is a superset of the one before:

| level           | needs (CPU flags)   | C++ kernels built with       | half-precision linears               |
|-----------------|---------------------|------------------------------|--------------------------------------|
| ``generic``     | any x86-64          | no ISA flags (SSE2 baseline) | plain ``F.linear``                   |
| ``avx2``        | avx2, fma, f16c     | ``-mavx2 -mfma -mf16c``      | bfloat16 ``bf16_dot`` (float32 FMAs) |
| ``avx512``      | + avx512 f/bw/vl/dq | + ``-mavx512f/bw/vl/dq``     | bfloat16 ``bf16_dot`` (float32 FMAs) |
| ``avx512_bf16`` | + avx512_bf16       | + ``-mavx512bf16``           | bfloat16 ``vdpbf16ps`` (native)      |

float32 models always keep ``F.linear`` (the reference dtype matches transformers token
for token); float16 models use float32-packed linears from ``avx2`` up. At ``avx2`` and
``avx512`` a bfloat16 model's linears run the ``bf16_dot`` kernel with each pair of bfloat16
products as two float32 FMAs (``models/bf16_dot_linear.py``; 8 or 16 lanes, the same bits):
bfloat16 weights, half the bytes of the float32-packed oneDNN copy that
``PAGED_CORE_CPU_LINEAR=onednn`` keeps there.

``PAGED_CORE_CPU_ISA`` (``auto``, the default, or a level above) caps the level: a
machine with AVX512-BF16 can run every path, so its tests exercise the code an AVX2
machine takes. Asking for a level the CPU lacks is an error naming the setting and the
missing flags, never a crash on an illegal instruction.

The bfloat16 linears of the ``avx512_bf16`` level run paged-core's own ``vdpbf16ps``
kernel (``bf16_dot``, ``models/bf16_dot_linear.py``), the same kernel on AMX tiles
(``amx``: CPUs with AMX-BF16 only) or oneDNN's bfloat16 GEMM
(``onednn``): ``PAGED_CORE_CPU_LINEAR`` (``auto``: ``amx`` on CPUs with AMX-BF16, else
``bf16_dot``) picks one. Its bfloat16 attention tiles likewise multiply with ``vdpbf16ps``
(``bf16_dot``) or AMX tiles (``amx``): ``PAGED_CORE_CPU_ATTENTION`` (``auto``: ``amx`` on
CPUs with AMX-BF16, else ``bf16_dot``).
"""
from __future__ import annotations

import functools
import os

import torch

CPU_ISA_LEVELS = ("generic", "avx2", "avx512", "avx512_bf16")

# The torch.cpu.get_capabilities() flags each level adds to the one below it.
_LEVEL_FLAGS = {
    "generic": (),
    "avx2": ("avx2", "fma3", "f16c"),
    "avx512": ("avx512_f", "avx512_bw", "avx512_vl", "avx512_dq"),
    "avx512_bf16": ("avx512_bf16",),
}

SETTING = "PAGED_CORE_CPU_ISA"
LINEAR_SETTING = "PAGED_CORE_CPU_LINEAR"
BF16_LINEAR_KERNELS = ("bf16_dot", "amx", "onednn")
ATTENTION_SETTING = "PAGED_CORE_CPU_ATTENTION"
BF16_ATTENTION_KERNELS = ("bf16_dot", "amx")
# What each kernel setting picks, and its kernels.
_KERNELS = {LINEAR_SETTING: ("linear", BF16_LINEAR_KERNELS),
            ATTENTION_SETTING: ("attention", BF16_ATTENTION_KERNELS)}


@functools.lru_cache(maxsize=None)
def _capabilities() -> dict:
    """This CPU's flags as torch reports them (fixed for the process's life)."""
    return torch.cpu.get_capabilities()


def _missing_flags(level: str) -> list[str]:
    """The CPU flags ``level`` (and every level below it) needs that this CPU lacks."""
    caps = _capabilities()
    needed = [flag for lvl in CPU_ISA_LEVELS[:CPU_ISA_LEVELS.index(level) + 1]
              for flag in _LEVEL_FLAGS[lvl]]
    return [flag for flag in needed if caps.get(flag) is not True]


@functools.lru_cache(maxsize=None)
def supported_cpu_isas() -> tuple[str, ...]:
    """Every level this CPU can run, lowest first (always starts with ``generic``); worked out
    once (the flags are fixed), as ``selected_cpu_isa`` asks on every call: ~5 us a call
    before, twice in each ``cpu_paged_attention`` call left to its default level."""
    return tuple(level for level in CPU_ISA_LEVELS if not _missing_flags(level))


def unsupported_reason(level: str) -> str | None:
    """Why this CPU cannot run ``level`` (for test skips and errors), or None if it can."""
    missing = _missing_flags(level)
    return f"this CPU lacks {', '.join(missing)} (needed by the {level} path)" if missing else None


def selected_cpu_isa() -> str:
    """The level this process uses now: ``PAGED_CORE_CPU_ISA`` if set (not ``auto``), else the
    highest this CPU supports. Read on every call, so each new engine sees the current value.

    Raises ``ValueError`` for an unknown level or one this CPU cannot run.
    """
    raw = os.environ.get(SETTING, "").strip().lower()
    if raw in ("", "auto"):
        return supported_cpu_isas()[-1]
    if raw not in CPU_ISA_LEVELS:
        raise ValueError(f"{SETTING}={raw!r} is not a CPU path; choose auto or one of "
                         f"{', '.join(CPU_ISA_LEVELS)}")
    reason = unsupported_reason(raw)
    if reason is not None:
        raise ValueError(f"{SETTING}={raw}: {reason}; this CPU supports "
                         f"{', '.join(supported_cpu_isas())}")
    return raw


def packed_linear_dtype(device: torch.device, dtype: torch.dtype,
                        level: str | None = None) -> torch.dtype | None:
    """The dtype prepacked oneDNN linears compute in for a ``dtype`` model on ``device`` at
    ``level`` (default: the selected one); ``None`` keeps ``F.linear`` (float32 models, the
    ``generic`` level, other devices, no oneDNN)."""
    if (device.type != "cpu" or dtype not in (torch.bfloat16, torch.float16)
            or not torch.backends.mkldnn.is_available()):
        return None
    level = level or selected_cpu_isa()
    if level == "generic":
        return None
    return dtype if level == "avx512_bf16" and dtype == torch.bfloat16 else torch.float32


def has_amx_bf16() -> bool:
    """True if this CPU has AMX-BF16 tiles (Sapphire Rapids and later)."""
    return _capabilities().get("amx_bf16") is True


def requested_bf16_kernel(setting: str) -> str:
    """``setting`` (``PAGED_CORE_CPU_LINEAR`` or ``PAGED_CORE_CPU_ATTENTION``) as the user wrote
    it, lower-cased: ``auto`` when unset, else the raw value, unchecked
    (``selected_bf16_kernel`` checks it)."""
    return os.environ.get(setting, "").strip().lower() or "auto"


def selected_bf16_kernel(setting: str) -> str:
    """The kernel ``setting`` picks for the AVX-512 levels' bfloat16 linears
    (``PAGED_CORE_CPU_LINEAR``) or attention tiles (``PAGED_CORE_CPU_ATTENTION``; see the
    module doc): its value if set (not ``auto``), else ``amx`` on CPUs with AMX-BF16 and
    ``bf16_dot`` on the others. Read on every call; raises ``ValueError`` for a value the
    setting does not know or ``amx`` on a CPU without AMX-BF16."""
    what, kernels = _KERNELS[setting]
    raw = requested_bf16_kernel(setting)
    if raw == "auto":
        return "amx" if has_amx_bf16() else "bf16_dot"
    if raw not in kernels:
        raise ValueError(f"{setting}={raw!r} is not a bfloat16 {what} kernel; choose auto or one "
                         f"of {', '.join(kernels)}")
    if raw == "amx" and not has_amx_bf16():
        raise ValueError(f"{setting}=amx: this CPU lacks amx_bf16; choose auto or "
                         f"{others_than_amx(setting)}")
    return raw


def others_than_amx(setting: str) -> str:
    """The kernels ``setting`` offers besides ``amx``, for error messages."""
    kernels = _KERNELS[setting][1]
    return " or ".join(k for k in kernels if k != "amx")


def selected_bf16_linear() -> str:
    """``selected_bf16_kernel`` of ``PAGED_CORE_CPU_LINEAR``."""
    return selected_bf16_kernel(LINEAR_SETTING)


def selected_bf16_attention() -> str:
    """``selected_bf16_kernel`` of ``PAGED_CORE_CPU_ATTENTION``."""
    return selected_bf16_kernel(ATTENTION_SETTING)
