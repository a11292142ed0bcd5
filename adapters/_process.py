"""Running a serving framework's own launcher as a child process.

Invariants: the child gets the engine settings as ``PAGED_CORE_*`` variables
(``config_env``); ``run_foreground`` returns only once the child has exited,
and Ctrl-C (or SIGTERM to us) is forwarded as SIGINT, then SIGTERM, then
SIGKILL if the child does not stop in time.
"""
from __future__ import annotations

import os
import signal
import subprocess
from typing import Mapping, Sequence

from paged_core.config import EngineConfig

from ._settings import config_env


def child_env(config: EngineConfig, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Our environment, minus stale ``PAGED_CORE_*`` values, plus ``config``'s."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGED_CORE_")}
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.update(config_env(config))
    env.update(extra or {})
    return env


def stop_child(proc: subprocess.Popen, grace_s: float = 30.0) -> int:
    """SIGINT, then SIGTERM, then SIGKILL, each after a grace period; returns the exit code."""
    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            break
        proc.send_signal(sig)
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


def run_foreground(cmd: Sequence[str], env: Mapping[str, str], cwd: str | None = None) -> int:
    """Run ``cmd`` until it exits; Ctrl-C / SIGTERM stop it cleanly. Returns its exit code."""
    proc = subprocess.Popen(list(cmd), env=dict(env), cwd=cwd)

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
