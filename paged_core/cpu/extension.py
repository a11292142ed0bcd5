"""The C++ CPU kernels of paged-core, built on first use, one build per CPU path.

Sources live in ``paged_core/cpu/csrc``: ``paged_attention.cpp`` (attention of a
packed step over the paged cache), ``fused_ops.cpp`` (RMSNorm, add + RMSNorm,
rotary embedding, SiLU-and-multiply), ``bf16_dot_linear.cpp`` (the bfloat16
linear of the ``avx512`` and ``avx512_bf16`` levels), ``decoder_stack.cpp`` (every decoder
layer of a model in one call: ``torch.classes.paged_core_cpu_<level>.DecoderStack``) and
``quantized_linear.cpp`` (weight-only int4 / int8 products and W8A8, ``quantization``; W4A8 in
``quantized_w4a8.cpp``; the ``avx2`` and ``avx512`` levels' 8- and 4-bit column groups for
float32 FMAs in ``quantized_fma_columns.cpp``; the ``avx512_bf16`` level's column layout in
``quantized_column_*.cpp`` and, for 8 bits on AMX-INT8 tiles, ``quantized_int8_tiles.cpp``;
W8A8 and W4A8 on AMX-INT8 tiles in ``quantized_vnni_tiles.cpp`` and
``quantized_w4a8_tiles.cpp``),
``lora_products.cpp`` (the LoRA products of a step's adapters, ``lora.products``) and
``greedy_tokens.cpp`` (each row's argmax, for the sampler). Each level of
``paged_core.cpu.isa`` (``generic``, ``avx2``, ``avx512``, ``avx512_bf16``) is its
own build, compiled with that level's explicit ISA flags (never ``-march=native``,
so a build cache shared between machines stays safe) and registered as its own op
namespace, ``torch.ops.paged_core_cpu_<level>``: one process can load several
(tests run every path the host supports) and each caller picks one with
``cpu_ops(level)``. They are compiled with ``torch.utils.cpp_extension.load`` (a
C++ compiler and ``ninja``, which the ``ninja`` wheel brings; one to two minutes on
2 cores per level, then cached under ``~/.cache/torch_extensions`` or
``$TORCH_EXTENSIONS_DIR``, see ``build_directory``). The sources that hold code only for
the vector levels (``_VECTOR_LEVEL_SOURCES``: every level but ``generic``) or the
``avx512_bf16`` level (``_BF16_LEVEL_SOURCES``) are compiled at those levels alone.
``cpu_extension_available()`` says whether that worked; on failure it logs one warning
with the reason, and every caller keeps its plain-torch path.

Processes that load at the same time (server workers, test workers, TP ranks)
take turns through an ``flock`` on the build folder (``_build_folder_lock``), so
a process killed while loading never leaves the others waiting forever.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import platform
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from .isa import (others_than_amx, requested_bf16_kernel, selected_bf16_kernel, selected_cpu_isa,
                  unsupported_reason)

logger = logging.getLogger(__name__)

_CSRC = Path(__file__).with_name("csrc")
# Sources compiled at every level, then those holding code for the vector levels alone (their
# bodies sit under ``#if PAGED_CORE_BF16_DOT``: AVX2 and FMA) and for the avx512_bf16 level
# alone (under ``#if defined(__AVX512BF16__)``); compiling them elsewhere would parse torch's
# headers for an empty object, ~15 s each on 2 cores.
_SOURCES = ("paged_attention.cpp", "fused_ops.cpp", "decoder_stack.cpp", "quantized_linear.cpp",
            "quantized_w4a8.cpp", "token_levels.cpp", "lora_products.cpp", "greedy_tokens.cpp")
_VECTOR_LEVEL_SOURCES = ("bf16_dot_linear.cpp", "quantized_row_dense.cpp",
                         "quantized_fma_columns.cpp")
_BF16_LEVEL_SOURCES = ("bf16_amx_linear.cpp", "quantized_column_linear.cpp",
                       "quantized_column_amx.cpp", "quantized_int8_tiles.cpp",
                       "quantized_vnni_tiles.cpp", "quantized_w4a8_tiles.cpp")


def _sources(level: str) -> tuple[str, ...]:
    """The source files ``level``'s build compiles."""
    vector = _VECTOR_LEVEL_SOURCES if level != "generic" else ()
    return _SOURCES + vector + (_BF16_LEVEL_SOURCES if level == "avx512_bf16" else ())


# Compiler flags each level adds to the one below it (see ``paged_core.cpu.isa``).
_LEVEL_CFLAGS = {
    "generic": [],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"],
    "avx512_bf16": ["-mavx512bf16"],
}


def _isa_cflags(level: str) -> list[str]:
    """The explicit ISA flags of ``level`` and every level below it."""
    levels = list(_LEVEL_CFLAGS)
    return [flag for lvl in levels[:levels.index(level) + 1] for flag in _LEVEL_CFLAGS[lvl]]


def ops_namespace(level: str) -> str:
    """The extension's name and op namespace of ``level``'s build: ``paged_core_cpu_<level>``."""
    return f"paged_core_cpu_{level}"


def build_directory(level: str | None = None) -> Path:
    """The folder torch builds ``level``'s kernels in (default: the selected level; created if
    missing): ``paged_core_cpu_<level>-torch<version>-<digest of torch's folder>`` in torch's
    extensions folder, with the sources compiled from a copy in its ``csrc`` subfolder
    (``_sync_sources``).

    torch's build file names each source and each of torch's include folders by its path,
    and ninja rebuilds everything (minutes on 2 cores) when a command changes. Compiling a
    copy at a fixed path lets every checkout and installed copy of the same sources that
    runs on one torch install share one build, where ninja recompiles only what changed
    (headers included, through its dependency files); a second torch install (another venv)
    gets its own folder instead of taking turns rebuilding one. torch's version is in the
    name too, since its headers are system includes that ninja does not track."""
    from torch.utils.cpp_extension import _get_build_directory

    torch_folder = Path(torch.__file__).resolve().parent
    where = hashlib.sha256(str(torch_folder).encode()).hexdigest()[:12]
    torch_version = torch.__version__.replace("+", "_")
    name = f"{ops_namespace(level or selected_cpu_isa())}-torch{torch_version}-{where}"
    return Path(_get_build_directory(name, verbose=False))


def _sync_sources(folder: Path) -> Path:
    """Make ``folder/csrc`` hold exactly the package's C++ sources and return it.

    Only files whose bytes differ are written (their modification time becomes now, so ninja
    recompiles what depends on them); unchanged files keep theirs, and files the package no
    longer has are removed. Called with the build folder's lock held."""
    copy = folder / "csrc"
    copy.mkdir(exist_ok=True)
    wanted = {source.name: source for source in _CSRC.iterdir()
              if source.suffix in (".cpp", ".h") and source.is_file()}
    for stale in copy.iterdir():
        if stale.name not in wanted:
            stale.unlink()
    for name, source in wanted.items():
        target = copy / name
        data = source.read_bytes()
        if not target.is_file() or target.read_bytes() != data:
            target.write_bytes(data)
    return copy


@contextlib.contextmanager
def _wheel_ninja_first_on_path() -> Iterator[None]:
    """While torch builds, the ``ninja`` of the ``ninja`` wheel (a dependency) comes first on
    PATH, whatever else PATH holds; afterwards PATH is as it was.

    torch runs ``ninja`` from PATH, and ninja versions keep build logs the others cannot
    read (1.13's log format and command hashes differ from 1.11's): processes of one install
    that found different ninjas (a venv not activated finds the system's; the Triton
    launcher puts the venv's bin first) rebuilt every kernel (minutes on 2 cores) whenever
    the other had built last. Without the wheel, PATH's ninja builds (or the build says
    that ninja is missing)."""
    try:
        import ninja
    except ImportError:
        yield
        return
    path = os.environ.get("PATH")
    os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, *([path] if path else [])])
    try:
        yield
    finally:
        if path is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = path


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
def _load(level: str) -> str | None:
    """Build and load ``level``'s extension once; return None on success, else why not."""
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return f"needs x86-64 Linux, this is {sys.platform}/{platform.machine()}"
    reason = unsupported_reason(level)
    if reason is not None:
        return reason
    try:
        from torch.utils.cpp_extension import load

        folder = build_directory(level)
        with _build_folder_lock(folder), _wheel_ninja_first_on_path():
            sources = _sync_sources(folder)
            load(
                name=ops_namespace(level),
                sources=[str(sources / source) for source in _sources(level)],
                extra_include_paths=[str(sources)],
                # No implicit FMA contraction: the fused ops round where torch rounds.
                extra_cflags=["-O3", "-fopenmp", "-ffp-contract=off",
                              f"-DPAGED_CORE_OPS={ops_namespace(level)}", *_isa_cflags(level)],
                extra_ldflags=["-fopenmp"],
                build_directory=str(folder),
                is_python_module=False,
                verbose=False,
            )
        ops = getattr(torch.ops, ops_namespace(level))
        ops.paged_attention, ops.rms_norm, ops.add_rms_norm, ops.rotary_embedding, ops.silu_and_mul  # noqa: B018
    except Exception as exc:  # noqa: BLE001 - reported, not swallowed
        return f"{type(exc).__name__}: {exc}"
    return None


@functools.lru_cache(maxsize=None)
def _available(level: str) -> bool:
    reason = _load(level)
    if reason is not None:
        logger.warning("paged-core's %s C++ CPU kernels are unavailable, using plain-torch code: "
                       "%s", level, reason)
        return False
    return True


def cpu_extension_available(level: str | None = None) -> bool:
    """True if ``level``'s C++ kernels (default: the selected level's) are built and loaded
    (builds them on the first call)."""
    return _available(level or selected_cpu_isa())


def cpu_extension_error(level: str | None = None) -> str | None:
    """Why ``level``'s C++ kernels (default: the selected level's) could not be loaded, or None."""
    return _load(level or selected_cpu_isa())


def cpu_ops(level: str | None = None):
    """``torch.ops.paged_core_cpu_<level>`` (default: the selected level), built if needed;
    looked up once per level (callers on the step path call this every layer).

    Raises ``RuntimeError`` with the reason if that build is unavailable.
    """
    return _ops_of(level or selected_cpu_isa())


@functools.lru_cache(maxsize=None)
def _ops_of(level: str):
    if not cpu_extension_available(level):
        raise RuntimeError(f"the {level} C++ CPU kernels are unavailable: {_load(level)}")
    return getattr(torch.ops, ops_namespace(level))


def amx_granted(setting: str) -> bool:
    """True if ``setting`` selects ``amx`` (``selected_bf16_kernel``) and the OS granted this
    process the AMX tile state (Linux 5.16 or later; the ``avx512_bf16`` kernels ask once).
    Where the OS refused, ``auto`` falls back to ``bf16_dot`` (False) and an explicit ``amx``
    raises ``RuntimeError`` naming the setting."""
    if selected_bf16_kernel(setting) != "amx":
        return False
    if cpu_ops("avx512_bf16").bf16_amx_ready():
        return True
    if requested_bf16_kernel(setting) == "auto":
        return False
    raise RuntimeError(f"{setting}=amx: the OS did not grant this process the AMX tile state "
                       f"(arch_prctl ARCH_REQ_XCOMP_PERM; Linux 5.16 or later); choose "
                       f"{others_than_amx(setting)}")
