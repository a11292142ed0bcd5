"""``PAGED_CORE_TENSOR_PARALLEL_SIZE=3 make serve``: the README's command, unchanged, serves the
embedded model sharded over 3 ranks (LitServe here; BentoML and Triton build the engine
the same way, from the same ``PAGED_CORE_*`` settings)."""
from __future__ import annotations

import signal
from pathlib import Path

import pytest

from . import openai_checks as checks
from .conftest import free_port, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.extended]

REPO = Path(__file__).resolve().parents[2]


def test_make_serve_with_three_ranks_gives_the_offline_greedy_text(request, log_dir,
                                                                   reference_texts):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = ["make", "-C", str(REPO), "serve", "ADAPTER=litserve", f"PORT={port}"]
    with running_server(request, "litserve-tp3", cmd, url + "/health", log_dir, signal.SIGINT,
                        extra_env={"PAGED_CORE_TENSOR_PARALLEL_SIZE": "3"}) as server:
        served = checks.Served("litserve", url, "/metrics")
        checks.greedy(served, reference_texts)
        checks.streaming(served, reference_texts)
        log = server.log_tail(200_000)
    # The engine really ran on 3 ranks: each worker logged its shard (9 heads, 3 KV heads).
    assert "rank 1 of 3 ready on cpu: 3 query heads, 1 KV heads" in log
    assert "rank 2 of 3 ready on cpu: 3 query heads, 1 KV heads" in log
    assert "worker rank" not in log  # no worker failure was logged
