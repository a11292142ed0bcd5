"""Starting the ``tritonserver`` that ``nvidia-pytriton`` bundles, on a paged-core repository.

The recipe (each step is a function below):

1. ``prepare_backends(work_dir)``: copy the bundled Python backend
   (``libtriton_python.so`` + ``triton_python_backend_utils.py``) and the stub
   built for *this* Python version into ``work_dir/backends/python``;
2. ``server_env()``: the stub embeds its own Python and ignores
   ``PYTHONPATH``; it finds our virtual environment through ``python3`` on
   ``PATH``, so the venv's ``bin`` goes first. ``LD_LIBRARY_PATH`` gets this
   interpreter's ``libpython`` directory, then ``nvidia_pytriton.libs``;
3. ``server_command(...)``: ``tritonserver --model-repository R
   --backend-directory B`` with explicit addresses and ports, in explicit model
   control (``EXPLICIT_MODE_ARGS``: every model of R loads at startup, as in the
   default mode). Explicit mode is what lets a model whose engine died unload
   itself, so that ``/v2/models/<name>/ready`` reports it (see ``python_model``);
   ``POST /v2/repository/models/<name>/load`` then builds a fresh engine.

``TritonServer`` runs that in its own process group (on Linux it also gets
SIGTERM if the launching process dies) and stops it with SIGINT
(Triton then unloads models, which shuts the engines down), escalating to
SIGKILL after ``grace_s``. Close client streams before stopping: Triton waits
up to ``--exit-timeout-secs`` for in-flight requests; ``serve`` sets that to the
engine's ``drain_timeout``, so open requests get the drain time a user set
(Triton's own default of 30 s, or a fixed value, would cut them off first).
"""
from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Sequence

from paged_core.config import EngineConfig

from .._process import popen_session
from .repository import DEFAULT_MODEL_NAME, write_repository

# load every model of the repository at startup, as the default mode does, but let models
# be unloaded and loaded (by the repository API, or by a model whose engine died)
EXPLICIT_MODE_ARGS = ("--model-control-mode=explicit", "--load-model=*")


def tritonserver_dist() -> Path:
    """``pytriton/tritonserver``: the bundled binary, backends and stubs (not imported)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("nvidia-pytriton is not installed: pip install 'paged-core[triton]'")
    dist = Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
    if not (dist / "bin" / "tritonserver").exists():
        raise RuntimeError(f"no tritonserver binary under {dist}")
    return dist


def prepare_backends(work_dir: str | os.PathLike) -> Path:
    """Copy the Python backend + this Python's stub into ``work_dir/backends``; return it."""
    dist = tritonserver_dist()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise RuntimeError(f"nvidia-pytriton bundles no Python backend stub for Python {version}")
    backends = Path(work_dir) / "backends"
    target = backends / "python"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(dist / "backends" / "python", target,
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(stub, target / "triton_python_backend_stub")
    return backends


def server_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for ``tritonserver`` and its Python stub (see module docstring)."""
    env = dict(os.environ if base is None else base)
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([venv_bin, env.get("PATH", "")])
    libs = [sysconfig.get_config_var("LIBDIR") or "",
            str(tritonserver_dist().parent.parent / "nvidia_pytriton.libs"),
            env.get("LD_LIBRARY_PATH", "")]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in libs if p)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def server_command(repository: str | os.PathLike, backends: str | os.PathLike, host: str,
                   http_port: int, grpc_port: int, metrics_port: int,
                   extra_args: Sequence[str] = (), exit_timeout_s: float = 10.0) -> list[str]:
    return [str(tritonserver_dist() / "bin" / "tritonserver"),
            f"--model-repository={repository}", f"--backend-directory={backends}",
            f"--http-address={host}", f"--http-port={http_port}",
            f"--grpc-address={host}", f"--grpc-port={grpc_port}",
            f"--metrics-address={host}", f"--metrics-port={metrics_port}",
            *EXPLICIT_MODE_ARGS, f"--exit-timeout-secs={math.ceil(exit_timeout_s)}",
            "--log-verbose=0", *extra_args]


class TritonServer:
    """A running ``tritonserver`` (own process group); use as a context manager."""

    def __init__(self, repository: str | os.PathLike, host: str = "127.0.0.1",
                 http_port: int = 8000, grpc_port: int | None = None,
                 metrics_port: int | None = None, work_dir: str | os.PathLike | None = None,
                 log: IO | None = None, extra_args: Sequence[str] = (),
                 exit_timeout_s: float = 10.0) -> None:
        """``exit_timeout_s``: how long Triton waits for in-flight requests once stopped."""
        self.host, self.http_port = host, http_port
        self.exit_timeout_s = exit_timeout_s
        self.grpc_port = grpc_port if grpc_port is not None else http_port + 1
        self.metrics_port = metrics_port if metrics_port is not None else http_port + 2
        self._tmp = None if work_dir else tempfile.TemporaryDirectory(prefix="paged-core-triton-")
        backends = prepare_backends(work_dir or self._tmp.name)
        self.command = server_command(repository, backends, host, self.http_port, self.grpc_port,
                                      self.metrics_port, extra_args, exit_timeout_s)
        self.proc = popen_session(self.command, env=server_env(), stdout=log, stderr=log)

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Block until ``/v2/health/ready`` is 200; raise if the server exits or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited with status {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"{self.http_url}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"tritonserver not ready after {timeout_s:.0f}s")

    def stop(self, grace_s: float | None = None) -> int:
        """SIGINT the process group, then SIGKILL after ``grace_s`` (default: the exit timeout
        plus 30 s for unloading); returns the exit code. Whatever is still in the group once
        tritonserver is gone (a Python stub it left behind) is killed too."""
        if grace_s is None:
            grace_s = self.exit_timeout_s + 30.0
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        code = self.proc.wait()
        if self._tmp is not None:
            self._tmp.cleanup()
        return code

    def __enter__(self) -> "TritonServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(host: str, http_port: int, config: EngineConfig, grpc_port: int | None = None,
          metrics_port: int | None = None, model_name: str = DEFAULT_MODEL_NAME) -> None:
    """Write a repository for ``config`` and run ``tritonserver`` on it until Ctrl-C / SIGTERM."""
    def _interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, _interrupt)
    with tempfile.TemporaryDirectory(prefix="paged-core-triton-") as work:
        repository = write_repository(Path(work) / "models", config, model_name)
        server = TritonServer(repository, host, http_port, grpc_port, metrics_port,
                              work_dir=work, exit_timeout_s=config.drain_timeout)
        try:
            code = server.proc.wait()
            if code != 0:
                raise SystemExit(f"tritonserver exited with status {code}")
        except KeyboardInterrupt:
            server.stop()
        finally:
            server.stop()
            signal.signal(signal.SIGTERM, previous)
