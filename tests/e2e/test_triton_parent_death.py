"""The Python stub that runs the engine never outlives ``tritonserver``.

Triton's stub watches its parent itself, but when the server dies without unloading the
model (here: SIGKILL; in practice a crash, or ``--exit-timeout-secs`` expiring during a
drain), the stub's own clean-up hung on the engine's threads and the stub (with its model
and KV cache) stayed behind for good. ``TritonPythonModel.initialize`` starts
``watch_parent``, which ends the stub at once.
"""
from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from paged_core.config import EngineConfig

from .conftest import free_port, running_server

pytest.importorskip("pytriton")
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.extended]


def test_the_stub_ends_when_tritonserver_is_killed(request, log_dir, tmp_path):
    from paged_core.adapters.triton_server import launcher, write_repository

    repository = write_repository(tmp_path / "models", EngineConfig(
        dtype="float32", max_model_len=256, num_kv_blocks=64))
    port = free_port(span=3)
    cmd = launcher.server_command(repository, launcher.prepare_backends(tmp_path), "127.0.0.1",
                                  port, port + 1, port + 2)
    env = {key: value for key, value in launcher.server_env().items()
           if key in ("PATH", "LD_LIBRARY_PATH")}
    url = f"http://127.0.0.1:{port}"
    with running_server(request, "triton-parent-death", cmd, f"{url}/v2/health/ready", log_dir,
                        signal.SIGINT, extra_env=env) as server:
        stubs = [child for child in psutil.Process(server.proc.pid).children(recursive=True)
                 if "triton_python_backend_stub" in _command_line(child)]
        assert stubs, "no Python-backend stub under tritonserver"
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=30)
        deadline = time.monotonic() + 20
        while (alive := [p for p in stubs if _running(p)]) and time.monotonic() < deadline:
            time.sleep(0.2)
        for stub in alive:  # do not leave it behind even when the assertion fails
            stub.kill()
        assert not alive, f"stub(s) {[p.pid for p in alive]} outlived tritonserver"


def _command_line(process: psutil.Process) -> str:
    """``process``'s command line, or "" if it ended since it was listed (tritonserver starts
    short-lived helpers of its own)."""
    try:
        return " ".join(process.cmdline())
    except psutil.NoSuchProcess:
        return ""


def _running(process: psutil.Process) -> bool:
    """Not exited (an exited orphan stays a zombie until this container's init reaps it)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
