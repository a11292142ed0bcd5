"""The C++ CPU kernels of paged-core, built on first use and loaded as ``torch.ops.paged_core_cpu``.

Sources live in ``paged_core/csrc``: ``paged_attention.cpp`` (attention of a
packed step over the paged cache) and ``fused_ops.cpp`` (RMSNorm, add +
RMSNorm, rotary embedding, SiLU-and-multiply). They are compiled with
``torch.utils.cpp_extension.load`` (a C++ compiler and ``ninja``, which the
``ninja`` wheel brings; a few seconds once per machine, then cached under
``~/.cache/torch_extensions`` or ``$TORCH_EXTENSIONS_DIR``).
``cpu_extension_available()`` says whether that worked; on failure it logs one
warning with the reason, and every caller keeps its plain-torch path.

Processes that load at the same time (server workers, test workers, TP ranks)
take turns through an ``flock`` on the build folder (``_build_folder_lock``), so
a process killed while loading never leaves the others waiting forever.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import platform
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

_CSRC = Path(__file__).with_name("csrc")
_SOURCES = ("paged_attention.cpp", "fused_ops.cpp")
_EXTENSION_NAME = "paged_core_cpu"


def _has_avx2_fma_f16c() -> bool:
    caps = torch.cpu.get_capabilities()
    return all(caps.get(flag) is True for flag in ("avx2", "fma3", "f16c"))


def _isa_cflags() -> list[str]:
    """AVX2+FMA+F16C where the CPU has them; never ``-march=native``, so a build cache
    shared between machines stays safe."""
    return ["-mavx2", "-mfma", "-mf16c"] if _has_avx2_fma_f16c() else []


def _extension_name() -> str:
    """This CPU's build name: the suffix keeps the two ISA builds apart in the cache."""
    return _EXTENSION_NAME + ("_avx2" if _isa_cflags() else "_generic")


def build_directory() -> Path:
    """The folder torch builds this CPU's kernels in (created if missing), as torch chooses it."""
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(_extension_name(), verbose=False))


def _ensure_ninja_on_path() -> None:
    """torch runs ``ninja`` from PATH; a venv used without activation has it only in its bin."""
    if shutil.which("ninja"):
        return
    try:
        import ninja
    except ImportError:
        return  # the build then says that ninja is missing
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


@contextlib.contextmanager
def _build_folder_lock(folder: Path) -> Iterator[None]:
    """Hold the (existing) build ``folder`` alone while torch loads (and if needed builds) into it.

    torch marks a load in progress with a ``lock`` file there that only a normal
    return removes: a process killed inside ``load`` (SIGKILL, SIGTERM, OOM) leaves
    it behind, and every later ``load`` of that folder then sleeps forever without
    a word. An ``flock`` is dropped by the kernel when its holder dies; since every
    paged-core load takes this one first, a ``lock`` file found while holding it
    belongs to no live process, and is removed.
    """
    with open(folder / "paged_core.flock", "a", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes or this process dies
        stale = folder / "lock"
        if stale.exists():
            logger.warning("removing %s, left by a process killed while loading the C++ kernels",
                           stale)
            stale.unlink(missing_ok=True)
        yield


@functools.lru_cache(maxsize=None)
def _load() -> str | None:
    """Build and load the extension once; return None on success, else why not."""
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return f"needs x86-64 Linux, this is {sys.platform}/{platform.machine()}"
    try:
        from torch.utils.cpp_extension import load

        _ensure_ninja_on_path()
        folder = build_directory()
        with _build_folder_lock(folder):
            load(
                name=_extension_name(),
                sources=[str(_CSRC / source) for source in _SOURCES],
                extra_include_paths=[str(_CSRC)],
                # No implicit FMA contraction: the fused ops round where torch rounds.
                extra_cflags=["-O3", "-fopenmp", "-ffp-contract=off", *_isa_cflags()],
                extra_ldflags=["-fopenmp"],
                build_directory=str(folder),
                is_python_module=False,
                verbose=False,
            )
        ops = torch.ops.paged_core_cpu
        ops.paged_attention, ops.rms_norm, ops.add_rms_norm, ops.rotary_embedding, ops.silu_and_mul  # noqa: B018
    except Exception as exc:  # noqa: BLE001 - reported, not swallowed
        return f"{type(exc).__name__}: {exc}"
    return None


@functools.lru_cache(maxsize=None)
def cpu_extension_available() -> bool:
    """True if the C++ kernels are built and loaded (builds them on the first call)."""
    reason = _load()
    if reason is not None:
        logger.warning("paged-core's C++ CPU kernels are unavailable, using plain-torch code: %s",
                       reason)
        return False
    return True


def cpu_extension_error() -> str | None:
    """Why the C++ kernels could not be loaded, or None if they are."""
    return _load()
