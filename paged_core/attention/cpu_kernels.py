"""Fused CPU paged-attention decode kernel (C++/OpenMP, compiled on first use).

``paged_decode_attention`` reads K/V straight from the paged cache (layout
``[num_kv_heads, num_blocks, block_size, head_dim]``, the torch backend's)
instead of gathering every sequence's blocks first: one OpenMP task per
(sequence, kv head) scores the group's query heads against each key with a
block-wise online softmax in float32.

The C++ source (``csrc/paged_decode.cpp``) is built lazily with
``torch.utils.cpp_extension.load_inline`` (a C++ compiler and ``ninja``, which
the ``ninja`` wheel brings; a few seconds once per machine, then cached under
``~/.cache/torch_extensions`` or ``$TORCH_EXTENSIONS_DIR``) and registered as
``torch.ops.paged_core_cpu.paged_decode``. ``cpu_decode_kernel_available()``
says whether that worked; on failure it logs one warning with the reason and
the torch backend keeps its plain-torch decode path.
"""
from __future__ import annotations

import functools
import logging
import os
import platform
import shutil
import sys
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("csrc") / "paged_decode.cpp"
_EXTENSION_NAME = "paged_core_cpu_decode"


def _has_avx2_fma_f16c() -> bool:
    caps = torch.cpu.get_capabilities()
    return all(caps.get(flag) is True for flag in ("avx2", "fma3", "f16c"))


def _ensure_ninja_on_path() -> None:
    """torch runs ``ninja`` from PATH; a venv used without activation has it only in its bin."""
    if shutil.which("ninja"):
        return
    try:
        import ninja
    except ImportError:
        return  # load_inline then says that ninja is missing
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


@functools.lru_cache(maxsize=None)
def _load() -> str | None:
    """Build and load the extension once; return None on success, else why not."""
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return f"needs x86-64 Linux, this is {sys.platform}/{platform.machine()}"
    try:
        from torch.utils.cpp_extension import load_inline

        _ensure_ninja_on_path()
        # AVX2+FMA+F16C where the CPU has them (the name keeps the two builds apart in the cache);
        # never -march=native, so a build cache shared between machines stays safe.
        isa = ["-mavx2", "-mfma", "-mf16c"] if _has_avx2_fma_f16c() else []
        name = _EXTENSION_NAME + ("_avx2" if isa else "_generic")
        load_inline(
            name=name,
            cpp_sources=[_SOURCE.read_text()],
            extra_cflags=["-O3", "-fopenmp", *isa],
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
            no_implicit_headers=True,
            verbose=False,
        )
        torch.ops.paged_core_cpu.paged_decode  # noqa: B018  (raises if registration failed)
    except Exception as exc:  # noqa: BLE001 - reported, not swallowed
        return f"{type(exc).__name__}: {exc}"
    return None


@functools.lru_cache(maxsize=None)
def cpu_decode_kernel_available() -> bool:
    """True if the fused kernel is built and loaded (builds it on the first call)."""
    reason = _load()
    if reason is not None:
        logger.warning("fused CPU paged-decode kernel unavailable, using the torch path: %s",
                       reason)
        return False
    return True


def paged_decode_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                           sliding_window: int | None = None,
                           out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode attention for one query token per sequence, straight from the paged cache.

    query ``[S, Hq, D]`` (sequence ``i``'s token at position ``seq_lens[i] - 1``; last dim
    contiguous), caches ``[Hk, num_blocks, block_size, D]`` contiguous, ``block_tables``
    ``[S, max_blocks]`` int32, ``seq_lens`` ``[S]`` int32. ``Hq`` must be a multiple of ``Hk``.
    With ``sliding_window`` only keys at positions ``p > seq_len - 1 - sliding_window`` count.
    float32 or bfloat16 (accumulated in float32); returns ``[S, Hq, D]`` in the query dtype,
    written into ``out`` (contiguous, like query) if given.
    Raises ``RuntimeError`` if the kernel is unavailable (check ``cpu_decode_kernel_available``).
    """
    if not cpu_decode_kernel_available():
        raise RuntimeError(f"fused CPU paged-decode kernel unavailable: {_load()}")
    if sliding_window is not None and sliding_window <= 0:
        raise ValueError(f"sliding_window must be positive, got {sliding_window}")
    if query.stride(-1) != 1:
        query = query.contiguous()
    if block_tables.dtype != torch.int32 or block_tables.stride(-1) != 1:
        block_tables = block_tables.to(torch.int32).contiguous()
    if seq_lens.dtype != torch.int32 or not seq_lens.is_contiguous():
        seq_lens = seq_lens.to(torch.int32).contiguous()
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    torch.ops.paged_core_cpu.paged_decode(query, k_cache, v_cache, block_tables, seq_lens,
                                          float(scale), int(sliding_window or 0), out)
    return out
