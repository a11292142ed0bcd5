"""llama.cpp's ``llama-server`` and ``llama-quantize``, built from source once into the cache.

The source is the llama.cpp that the ``llama-cpp-python`` sdist vendors
(``vendor/llama.cpp``), fetched with ``pip download`` (package registries are the
only network this project assumes). Layout under ``<cache>/llama.cpp/<version>/``:

- ``src/``: the unpacked sdist (its ``vendor/llama.cpp`` also holds
  ``convert_hf_to_gguf.py`` and ``gguf-py``, see ``llama_cpp_models``);
- ``build-<cpu key>/bin/llama-server`` and ``llama-quantize`` (``TARGETS``, which
  ``llama_cpp_models`` makes the K-quant file with): a Release build with ``GGML_NATIVE=ON``,
  so it uses every vector extension of the CPU it was built on. The folder is
  keyed by this CPU's ISA flags and the build's compiler flags: a cache shared
  with another machine class never runs a binary built for instructions that
  machine lacks, and a change of flags builds anew.

``COMPILER_FLAGS`` keeps GCC from dropping the stores that fill ggml's AMX tile
configuration: its ``ldtilecfg`` intrinsic names only 8 bytes of the 64-byte
operand, so with dead-store elimination (GCC 12, -O2) ggml's AMX kernels died of
SIGILL on the first tile instruction of an AMX CPU (an Intel Xeon here).

Invariant: ``built_binary(name)`` returns a path only once a build of every target finished
(a stamp file is written after cmake succeeded, so a killed build is redone; a folder built
before a target joined ``TARGETS`` builds the missing one); builds take turns through an flock
on the version folder.
"""
from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, TextIO

from paged_core.models.embedded_model import cache_dir

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
SERVER = "llama-server"
QUANTIZE = "llama-quantize"
TARGETS = (SERVER, QUANTIZE)
BUILT_STAMP = ".built"
COMPILER_FLAGS = "-fno-tree-dse -fno-dse"  # see the module doc


def version_dir(version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    return Path(cache_dir()) / "llama.cpp" / version


def source_dir(version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    """The vendored llama.cpp tree inside the unpacked sdist (exists once ``ensure_source`` ran)."""
    return version_dir(version) / "src" / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"


def cpu_key() -> str:
    """8 hex digits naming this CPU's vector-ISA flags and ``COMPILER_FLAGS`` (the build
    folder's suffix)."""
    from .report import cpu_flags

    return hashlib.sha256(f"{','.join(cpu_flags())};{COMPILER_FLAGS}".encode()).hexdigest()[:8]


def build_dir(version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    return version_dir(version) / f"build-{cpu_key()}"


def built_binary(name: str, version: str = LLAMA_CPP_PYTHON_VERSION) -> Path | None:
    """The cached binary ``name`` (one of ``TARGETS``) for this CPU, or None until a build of
    every target finished here."""
    build = build_dir(version)
    done = (build / BUILT_STAMP).is_file() and all((build / "bin" / t).is_file() for t in TARGETS)
    return build / "bin" / name if done else None


def find_cmake() -> str:
    """``cmake`` next to this interpreter (the pip ``cmake`` package) or on ``PATH``."""
    beside = Path(sys.executable).parent / "cmake"
    found = str(beside) if beside.is_file() else shutil.which("cmake")
    if found is None:
        raise RuntimeError("building llama.cpp needs cmake: `pip install cmake` (the `bench` extra) "
                           "or `apt-get install -y cmake`")
    if not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        raise RuntimeError("building llama.cpp needs a C++ compiler: `apt-get install -y g++`")
    return found


def configure_command(cmake: str, source: Path, build: Path) -> list[str]:
    """CPU-only Release build for this machine; nothing fetched at build time (no web UI
    download, no HTTPS client: the server only ever serves a local file over loopback)."""
    return [cmake, "-S", str(source), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
            "-DGGML_NATIVE=ON", f"-DCMAKE_C_FLAGS={COMPILER_FLAGS}",
            f"-DCMAKE_CXX_FLAGS={COMPILER_FLAGS}", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_OPENSSL=OFF",
            "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"]


def build_command(cmake: str, build: Path, jobs: int) -> list[str]:
    return [cmake, "--build", str(build), "--target", *TARGETS, "-j", str(jobs)]


def ensure_binary(name: str, jobs: int, log: TextIO = sys.stderr,
                  version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    """The cached binary ``name`` (one of ``TARGETS``), building every target first if needed
    (minutes; output to ``log``)."""
    binary = built_binary(name, version)
    if binary is not None:
        return binary
    cmake = find_cmake()
    source = ensure_source(log, version)
    with _build_lock(version):
        if built_binary(name, version) is None:  # nobody built it while we waited for the lock
            build = build_dir(version)
            print(f"building {', '.join(TARGETS)} (llama-cpp-python {version}) in {build}",
                  file=log)
            for command in (configure_command(cmake, source, build),
                            build_command(cmake, build, jobs)):
                run_logged(command, log)
            missing = [t for t in TARGETS if not (build / "bin" / t).is_file()]
            if missing:
                raise RuntimeError(f"cmake finished but {build}/bin lacks {', '.join(missing)}")
            (build / BUILT_STAMP).touch()
    return build_dir(version) / "bin" / name


def ensure_source(log: TextIO = sys.stderr, version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    """The vendored llama.cpp tree, downloading and unpacking the sdist on first use."""
    source = source_dir(version)
    with _build_lock(version):
        if not source.is_dir():
            _download_source(log, version)
    if not source.is_dir():
        raise RuntimeError(f"the llama-cpp-python {version} sdist has no vendor/llama.cpp")
    return source


def _download_source(log: TextIO, version: str) -> None:
    with tempfile.TemporaryDirectory(prefix=".download-", dir=version_dir(version)) as tmp:
        run_logged([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    f"llama-cpp-python=={version}", "-d", tmp], log)
        (sdist,) = Path(tmp).glob("llama_cpp_python-*.tar.gz")
        unpacked = Path(tmp) / "src"
        with tarfile.open(sdist) as archive:
            archive.extractall(unpacked, filter="data")
        unpacked.rename(version_dir(version) / "src")  # the tree appears whole or not at all


@contextmanager
def _build_lock(version: str) -> Iterator[None]:
    """Held while the source is unpacked or the binary built (by any process)."""
    folder = version_dir(version)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def run_logged(command: list[str], log: TextIO) -> None:
    """Run ``command`` with its output in ``log`` (a real file); raise if it fails."""
    print("+ " + " ".join(command), file=log, flush=True)
    subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=True)
