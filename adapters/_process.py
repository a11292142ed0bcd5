"""Running a serving framework's own launcher as a child process.

Invariants: the child gets the engine settings as ``PAGED_CORE_*`` variables
(``config_env``); it runs in its own session, so a terminal's Ctrl-C reaches
only us and we forward exactly one SIGINT (then SIGTERM, then SIGKILL if it
does not stop in time); on Linux it gets SIGTERM if we die without stopping it;
``run_foreground`` returns only once the child has exited.
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import fields
from typing import Mapping, Sequence

import psutil

from paged_core.config import EngineConfig

from ._settings import config_env


def child_env(config: EngineConfig, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Our environment, minus stale engine settings (``PAGED_CORE_<EngineConfig field>``), plus
    ``config``'s. Process-wide ``PAGED_CORE_*`` settings that are no engine field
    (``PAGED_CORE_CPU_ISA``, ``PAGED_CORE_CACHE_DIR``, ...) pass through unchanged."""
    engine_settings = {f"PAGED_CORE_{f.name.upper()}" for f in fields(EngineConfig)}
    env = {k: v for k, v in os.environ.items() if k not in engine_settings}
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.update(config_env(config))
    env.update(extra or {})
    return env


def die_with_parent() -> None:
    """``preexec_fn`` (Linux): the child gets SIGTERM when the process that started it dies."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def popen_session(cmd: Sequence[str], **kwargs) -> subprocess.Popen:
    """``Popen`` in a new session, tied to our lifetime on Linux."""
    return subprocess.Popen(list(cmd), start_new_session=True,
                            preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
                            **kwargs)


def stop_child(proc: subprocess.Popen, grace_s: float = 30.0,
               first_signal: int = signal.SIGINT) -> int:
    """Stop ``proc`` and everything it started; returns its exit code.

    ``first_signal`` (the framework's documented stop signal), then SIGTERM,
    each after a grace period; then SIGKILL to the child's process group and to
    every descendant seen before stopping: serving frameworks put workers in
    process groups of their own (BentoML's circus does), which a group kill misses.
    """
    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    for sig, wait_s in ((first_signal, grace_s), (signal.SIGTERM, 10.0)):
        if proc.poll() is not None:
            break
        proc.send_signal(sig)
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group is already empty
        pass
    _, alive = psutil.wait_procs(descendants, timeout=5.0)
    for leftover in alive:
        try:
            leftover.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5.0)
    return proc.wait()


def run_foreground(cmd: Sequence[str], env: Mapping[str, str], cwd: str | None = None) -> int:
    """Run ``cmd`` until it exits; Ctrl-C / SIGTERM stop it cleanly. Returns its exit code."""
    proc = popen_session(cmd, env=dict(env), cwd=cwd)

    def _terminate(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        return stop_child(proc)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if proc.poll() is None:
            stop_child(proc)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    """Poll ``{url}/models`` until it answers 200; raise if the server exits or time runs out."""
    import httpx  # the bench and router extras' client; serving alone never polls

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode} before it was ready")
        try:
            if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:  # not listening yet: poll again
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server at {url} was not ready after {timeout_s:.0f} s")
