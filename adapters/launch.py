"""One entry point for the CLI: ``serve(adapter, host, port, config)``.

Each adapter is started the way its framework documents it:

- ``bentoml``: ``bentoml serve paged_core.adapters.bentoml.service:PagedLLM``
  (engine settings passed as ``PAGED_CORE_*`` variables);
- ``litserve``: ``python -m paged_core.adapters.litserve`` (a child process,
  because LitServe spawns workers that re-import ``__main__``; the caller's
  main module then never matters);
- ``triton``: the ``tritonserver`` bundled with ``nvidia-pytriton`` on a model
  repository written for ``config`` (``port`` is the HTTP port; gRPC is
  ``port + 1``, metrics ``port + 2``).

``serve`` blocks until the server exits; Ctrl-C stops it cleanly.
"""
from __future__ import annotations

import sys

from paged_core.config import EngineConfig

ADAPTERS = ("bentoml", "litserve", "triton")
BENTOML_TARGET = "paged_core.adapters.bentoml.service:PagedLLM"


def bentoml_command(host: str, port: int) -> list[str]:
    """The documented ``bentoml serve`` command line (run with this interpreter)."""
    return [sys.executable, "-m", "bentoml", "serve", BENTOML_TARGET,
            "--host", host, "--port", str(port)]


def litserve_command(host: str, port: int) -> list[str]:
    return [sys.executable, "-m", "paged_core.adapters.litserve", "--host", host,
            "--port", str(port)]


def serve(adapter: str, host: str, port: int, config: EngineConfig) -> None:
    """Serve ``config``'s engine through ``adapter`` on ``host:port`` until stopped."""
    if adapter in ("bentoml", "litserve"):
        from ._process import child_env, run_foreground

        command = (bentoml_command if adapter == "bentoml" else litserve_command)(host, port)
        code = run_foreground(command, child_env(config))
        if code not in (0, -2, 130):  # 130 / -SIGINT: stopped by Ctrl-C
            raise SystemExit(f"{adapter} server exited with status {code}")
    elif adapter == "triton":
        from .triton_server.launcher import serve as serve_triton

        serve_triton(host=host, http_port=port, config=config)
    else:
        raise ValueError(f"adapter must be one of {ADAPTERS}, got {adapter!r}")
