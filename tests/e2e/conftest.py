"""Real servers for the end-to-end tests, started the documented way, always stopped.

Each server runs in its own process group on free 127.0.0.1 ports, logs to a
file (printed if it fails to start or a test fails), and is stopped in a ``finally``: first the
signal its framework documents (SIGINT), then SIGKILL of the whole group.
Engines run in float32 so greedy text equals the offline ``LLM``'s exactly.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from paged_core.adapters._process import popen_session, stop_child

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, a small robot"]
CHAT = [{"role": "user", "content": "Name three primary colors."}]
MAX_TOKENS = 12
STARTUP_TIMEOUT_S = 240

SERVER_ENV = {
    "PAGED_CORE_DTYPE": "float32",
    "PAGED_CORE_MAX_MODEL_LEN": "1024",
    "PAGED_CORE_NUM_KV_BLOCKS": "512",
    "OMP_WAIT_POLICY": "PASSIVE",
    "TOKENIZERS_PARALLELISM": "false",
}


def free_port(span: int = 1) -> int:
    """A port ``p`` such that ``p .. p+span-1`` are all free on 127.0.0.1."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + span > 65535:
            continue
        try:
            socks = []
            for p in range(port, port + span):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError("no free port range found")


class ServerProcess:
    """A server command in its own process group, with its log file."""

    def __init__(self, name: str, cmd: list[str], ready_url: str, log_dir: Path,
                 stop_signal: int = signal.SIGINT, extra_env: dict[str, str] | None = None) -> None:
        self.name, self.cmd, self.ready_url = name, cmd, ready_url
        self.stop_signal = stop_signal
        self.returncode: int | None = None  # set by ``stop``
        self.log_path = log_dir / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PAGED_CORE_")}
        env.update(SERVER_ENV)
        # BentoML empties $BENTOML_HOME/prometheus_multiproc_dir when it starts: two servers
        # sharing one home (the test workers run side by side) would wipe each other's metrics
        env["BENTOML_HOME"] = str(log_dir / f"{name}.bentoml-home")
        env.update(extra_env or {})
        self._log = open(self.log_path, "wb")
        # own session + SIGTERM if pytest dies: a killed test run leaves no server behind
        self.proc = popen_session(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                  cwd=log_dir)

    def log_tail(self, chars: int = 6000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n"
                                   f"{self.log_tail()}")
            try:
                if httpx.get(self.ready_url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} not ready after {timeout_s}s:\n{self.log_tail()}")

    def stop(self, grace_s: float = 30.0) -> int | None:
        """Documented stop signal, then SIGKILL to the group and every descendant; always reaps.
        The exit code is also kept as ``returncode`` (``-SIGKILL``: the signal was not enough)."""
        try:
            self.returncode = stop_child(self.proc, grace_s, self.stop_signal)
            return self.returncode
        finally:
            self._log.close()


@contextlib.contextmanager
def running_server(request: pytest.FixtureRequest, name: str, cmd: list[str], ready_url: str,
                   log_dir: Path, stop_signal: int = signal.SIGINT,
                   extra_env: dict[str, str] | None = None) -> Iterator[ServerProcess]:
    """Start, wait until ready, yield; always stop. Prints the server log if a test failed."""
    server = ServerProcess(name, cmd, ready_url, log_dir, stop_signal, extra_env)
    failed_before = request.session.testsfailed
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
        if request.session.testsfailed > failed_before:
            print(f"--- {name} server log (tail) ---\n{server.log_tail()}")


@pytest.fixture(scope="session")
def reference_texts(llm_fp32) -> dict[str, str]:
    """Greedy texts of the offline ``LLM`` (one prompt per call, as the servers see them)."""
    from paged_core import SamplingParams

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0)
    texts = {p: llm_fp32.generate(p, params, use_tqdm=False)[0].outputs[0].text for p in PROMPTS}
    texts["<chat>"] = llm_fp32.chat(CHAT, params, use_tqdm=False)[0].outputs[0].text
    return texts


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("server-logs")


def python_cmd(*args: str) -> list[str]:
    return [sys.executable, *args]
