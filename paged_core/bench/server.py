"""Start an adapter's server for ``bench serve`` and always stop it.

``running_server`` runs ``paged-core serve --adapter NAME`` as a child in a
session of its own (the adapters' ``popen_session``), waits until ``GET
/v1/models`` answers 200, yields the OpenAI base URL, and on the way out stops
it with the adapters' ``stop_child``: SIGINT, then SIGTERM, then SIGKILL to its
process group and every descendant (BentoML's workers live in groups of their
own). The server's output goes to a log file whose tail is shown if it fails to start.
``running_vllm_server`` does the same for ``vllm serve`` from another interpreter.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from typing import Iterator

from paged_core.adapters._process import free_port, popen_session, stop_child, wait_ready

from .vllm_runner import vllm_cpu_env


@contextlib.contextmanager
def running_server(adapter: str, dtype: str, ready_timeout_s: float = 300.0,
                   extra_args: tuple[str, ...] | list[str] = ()) -> Iterator[str]:
    """Serve the embedded model (or ``--model`` in ``extra_args``, more engine flags) through
    ``adapter`` on a free port; yields ``http://.../v1``."""
    port = free_port()
    cmd = [sys.executable, "-m", "paged_core.cli", "serve", "--adapter", adapter,
           "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype, *extra_args]
    with _serving(cmd, port, adapter, None, ready_timeout_s) as url:
        yield url


@contextlib.contextmanager
def running_vllm_server(python: str, dtype: str, threads: int, max_model_len: int = 1024,
                        ready_timeout_s: float = 600.0) -> Iterator[str]:
    """``vllm serve`` of the embedded model from ``python`` (a vllm-cpu environment) on a free
    port, with the settings vLLM's CPU build needs on a small machine; yields ``http://.../v1``."""
    from paged_core.models.embedded_model import embedded_model_folder

    port = free_port()
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", embedded_model_folder(),
           "--served-model-name", "SmolLM2-135M-Instruct", "--host", "127.0.0.1",
           "--port", str(port), "--dtype", dtype, "--max-model-len", str(max_model_len),
           "--gpu-memory-utilization", "0.25", "--seed", "0"]
    with _serving(cmd, port, "vllm", vllm_cpu_env(python, threads), ready_timeout_s) as url:
        yield url


@contextlib.contextmanager
def _serving(cmd: list[str], port: int, name: str, env: dict[str, str] | None,
             ready_timeout_s: float) -> Iterator[str]:
    env = env or dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    url = f"http://127.0.0.1:{port}/v1"
    with tempfile.NamedTemporaryFile("w+", prefix=f"paged-core-{name}-", suffix=".log") as log:
        proc = popen_session(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            try:
                wait_ready(url, proc, ready_timeout_s)
            except RuntimeError as exc:
                log.seek(0)
                raise RuntimeError(f"{exc}; command: {' '.join(cmd)}; log tail:\n"
                                   f"{log.read()[-3000:]}") from None
            yield url
        finally:
            stop_child(proc, grace_s=20.0)
