"""``paged-core serve-cluster``: two LitServe replicas behind vllm-router's ``kv_aware``
policy, started as a user would and driven with the ``openai`` client.

Each tenant's requests share a long prefix; the router reads the replicas' KV events and
sends a tenant's later requests where its prefix is cached, so every repeat hits the
prefix cache in full (round-robin would send the second request of each tenant to the
other replica: a miss). Answers through the router equal a replica's own; SIGTERM stops
the router and every replica.
"""
from __future__ import annotations

import signal
import time

import psutil
import pytest
from openai import OpenAI

from paged_core.bench.metrics_text import scrape

from ..reference import passage_token_ids
from .conftest import MAX_TOKENS, free_port, python_cmd, running_server

# Two replicas and a router (~45 s on 2 cores): `make test-all`, keeping CI under its 20 minutes.
pytestmark = pytest.mark.extended

BLOCK_SIZE = 16  # the engine's default
PREFIX_TOKENS = 200
REPEATS = 3


def _prefix_hits(replica_urls: list[str]) -> float:
    name = "paged_core_prefix_cache_hits_total"
    return sum(scrape(url, [name])[name] for url in replica_urls)


def _replica_urls(server) -> list[str]:
    """The replicas' URLs, from the line serve-cluster prints once its router answers."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in server.log_tail(200_000).splitlines():
            if line.startswith("paged-core cluster:"):
                return line.split("replicas at ")[1].split()
        time.sleep(0.2)
    raise AssertionError(f"serve-cluster printed no banner:\n{server.log_tail()}")


def test_kv_aware_routing_keeps_each_tenant_on_its_cached_prefix(request, log_dir, tokenizer):
    port = free_port()
    cmd = python_cmd("-m", "paged_core.cli", "serve-cluster", "--replicas", "2",
                     "--port", str(port))
    with running_server(request, "cluster", cmd, f"http://127.0.0.1:{port}/v1/models", log_dir,
                        stop_signal=signal.SIGTERM) as server:
        replica_urls = _replica_urls(server)
        assert len(replica_urls) == 2
        processes = psutil.Process(server.proc.pid).children(recursive=True)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        model = client.models.list().data[0].id
        tenants = [passage_token_ids(tokenizer, PREFIX_TOKENS, offset=300 * t) for t in range(3)]
        before = _prefix_hits(replica_urls)
        texts = {}
        for repeat in range(REPEATS):
            for t, prefix in enumerate(tenants):
                prompt = prefix + passage_token_ids(tokenizer, 5, offset=1000 + 10 * repeat)
                out = client.completions.create(model=model, prompt=prompt, temperature=0,
                                                 max_tokens=MAX_TOKENS)
                texts[(t, repeat)] = (prompt, out.choices[0].text)
        hits = _prefix_hits(replica_urls) - before
        full_prefix = PREFIX_TOKENS // BLOCK_SIZE * BLOCK_SIZE
        assert hits == len(tenants) * (REPEATS - 1) * full_prefix  # every repeat hit in full
        direct = OpenAI(base_url=replica_urls[1], api_key="none")
        prompt, text = texts[(0, REPEATS - 1)]
        assert direct.completions.create(model=model, prompt=prompt, temperature=0,
                                         max_tokens=MAX_TOKENS).choices[0].text == text
    assert server.proc.returncode is not None
    _, alive = psutil.wait_procs(processes, timeout=10)
    assert not alive, f"left running after SIGTERM: {[p.cmdline() for p in alive]}"
