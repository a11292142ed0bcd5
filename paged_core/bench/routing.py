"""``bench routing``: replicas behind vllm-router, prefix-aware (``kv_aware``) vs round-robin.

Workload: ``--tenants`` tenants, each with its own shared prefix of ``--prefix-tokens``
tokens (a system prompt, a document), ``--requests-per-tenant`` requests per tenant, each
adding its own question (``--question-tokens``) and asking for ``--output-tokens`` tokens;
the requests go out in a seeded shuffled order, ``--concurrency`` in flight at a time.
Every replica holds ``--kv-blocks`` KV blocks: room for its share of the tenants' prefixes
when routing keeps each tenant on one replica, too few for all of them (the pressure under
which round-robin keeps recomputing prefixes). Three runs of the same requests, each on
freshly started servers (empty caches) through ``paged-core``'s cluster glue:

- ``single``: one replica with the whole cluster's KV blocks (``replicas * kv_blocks``),
  no router: the hit rate routing should keep;
- ``round_robin``: ``--replicas`` replicas behind ``vllm-router --policy round_robin``;
- ``kv_aware``: the same replicas behind ``vllm-router --policy kv_aware``, which reads
  every replica's KV events;
- ``kv_aware_affinity``: the same with kv_aware's session affinity (``serve-cluster
  --session-affinity-ttl``): every request names its tenant in an ``x-session-id`` header
  (all runs send it; only this one uses it), so a tenant's requests stay on one replica even
  before its prefix is announced.

Per run: prefix-cache hit rate (hit / looked-up prompt tokens over all replicas, from their
``/metrics``), TTFT p50/p99, output tok/s, and each replica's share of the output tokens.
Goals: the KV-aware runs' hit rate within 10% of single's, their TTFT p50 at least 2x better
than round-robin's.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import re
import tempfile
import time
from typing import Any, Iterator

import httpx

from .clients import HTTPClient, RequestRecord
from .metrics_text import scrape
from .report import new_figure, percentiles, save_plot
from .workload import BenchRequest

NAME = "routing"
POLICIES = ("single", "round_robin", "kv_aware", "kv_aware_affinity")
KV_AWARE = ("kv_aware", "kv_aware_affinity")
AFFINITY_TTL_S = 3600
_TOKEN_RANGE = (100, 30_000)  # token ids the embedded model's vocabulary holds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--adapter", choices=("litserve", "bentoml"), default="litserve")
    parser.add_argument("--tenants", type=int, default=12)
    parser.add_argument("--prefix-tokens", type=int, default=512)
    parser.add_argument("--requests-per-tenant", type=int, default=6)
    parser.add_argument("--question-tokens", type=int, default=32)
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--kv-blocks", type=int, default=256,
                        help="KV blocks per replica (16 tokens each)")


def tenant_requests(args: argparse.Namespace) -> list[tuple[int, BenchRequest]]:
    """``(tenant, request)`` pairs in the order they are sent (seeded)."""
    rng = random.Random(args.seed)
    prefixes = [[rng.randrange(*_TOKEN_RANGE) for _ in range(args.prefix_tokens)]
                for _ in range(args.tenants)]
    pairs = [(t, BenchRequest(prefixes[t] + [rng.randrange(*_TOKEN_RANGE)
                                             for _ in range(args.question_tokens)],
                              args.output_tokens))
             for t in range(args.tenants) for _ in range(args.requests_per_tenant)]
    rng.shuffle(pairs)
    return pairs


def _quick(args: argparse.Namespace) -> None:
    args.tenants, args.prefix_tokens, args.requests_per_tenant = 4, 128, 3
    args.question_tokens, args.output_tokens, args.kv_blocks = 16, 4, 40


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.quick:
        _quick(args)
    requests = tenant_requests(args)
    results: dict[str, Any] = {
        "dtype": args.dtype, "adapter": args.adapter, "replicas": args.replicas,
        "tenants": args.tenants, "prefix_tokens": args.prefix_tokens,
        "requests_per_tenant": args.requests_per_tenant, "question_tokens": args.question_tokens,
        "output_tokens": args.output_tokens, "concurrency": args.concurrency,
        "kv_blocks_per_replica": args.kv_blocks, "policies": {}}
    for policy in POLICIES:
        with _target(args, policy) as (url, cluster):
            run = _measure(url, cluster.replica_urls, cluster.model_name, requests,
                           args.concurrency)
            if policy in KV_AWARE:
                run["router_placements"] = _router_placements(cluster.router_metrics_url)
            results["policies"][policy] = run
    single, rr = results["policies"]["single"], results["policies"]["round_robin"]
    results["goals"] = {policy: {
        "hit_rate_vs_single": results["policies"][policy]["hit_rate"] / single["hit_rate"],
        "ttft_p50_speedup_vs_round_robin":
            rr["ttft_ms"]["p50"] / results["policies"][policy]["ttft_ms"]["p50"]}
        for policy in KV_AWARE}
    return results


@contextlib.contextmanager
def _target(args: argparse.Namespace, policy: str) -> Iterator[tuple[str, Any]]:
    """``(OpenAI URL to send to, the cluster)`` of one fresh deployment."""
    from ..adapters.cluster import running_cluster
    from ..config import EngineConfig

    single = policy == "single"
    blocks = args.kv_blocks * (args.replicas if single else 1)
    config = EngineConfig.from_env(dtype=args.dtype, num_kv_blocks=blocks,
                                   enable_prefix_caching=True)
    affinity = policy == "kv_aware_affinity"
    with tempfile.TemporaryDirectory(prefix="paged-core-routing-") as logs, running_cluster(
            config, replicas=1 if single else args.replicas, adapter=args.adapter,
            policy="round_robin" if single else "kv_aware" if affinity else policy,
            log_dir=logs, threads_per_replica=args.threads // (1 if single else args.replicas) or 1,
            session_affinity_ttl_s=AFFINITY_TTL_S if affinity else None) as c:
        # ``single`` goes straight to its replica: the router would only add a hop.
        yield (c.replica_urls[0] if single else c.url), c


def _measure(url: str, replica_urls: list[str], model: str,
             requests: list[tuple[int, BenchRequest]], concurrency: int) -> dict[str, Any]:
    for i, replica in enumerate(replica_urls):  # first-request costs, outside the timing
        httpx.post(f"{replica}/completions", timeout=300, json={
            "model": model, "prompt": [7 + i] * 8, "max_tokens": 2})
    before = [_counters(u) for u in replica_urls]
    start = time.perf_counter()
    records = asyncio.run(_closed_loop(url, model, requests, concurrency))
    seconds = time.perf_counter() - start
    after = [_counters(u) for u in replica_urls]
    per_replica = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before)]
    queries = sum(r["queries"] for r in per_replica)
    ok = [r for r in records if r.ok]
    return {"hit_rate": sum(r["hits"] for r in per_replica) / queries if queries else 0.0,
            "ttft_ms": percentiles([r.ttft * 1000 for r in ok]),
            "output_tok_per_s": sum(r.output_tokens for r in ok) / seconds,
            "seconds": seconds, "failed": len(records) - len(ok),
            "per_replica": per_replica}


async def _closed_loop(url: str, model: str, requests: list[tuple[int, BenchRequest]],
                       concurrency: int) -> list[RequestRecord]:
    client = HTTPClient(url, model=model)
    gate = asyncio.Semaphore(concurrency)

    async def one(tenant: int, request: BenchRequest) -> RequestRecord:
        async with gate:
            return await client.send(request, headers={"x-session-id": f"tenant-{tenant}"})

    try:
        return list(await asyncio.gather(*(one(t, r) for t, r in requests)))
    finally:
        await client.close()


def _router_placements(metrics_url: str) -> dict[str, float]:
    """vllm-router's own count of kv_aware lookups by result (``hit``: the request went where
    part of its prefix was cached; ``miss``: nowhere held any of it)."""
    text = httpx.get(metrics_url, timeout=30).text
    return {result: float(value) for result, value in re.findall(
        r'^vllm_router_kv_placement_lookups_total\{result="(\w+)"\} (\S+)$', text, re.M)}


_COUNTERS = {"queries": "paged_core_prefix_cache_queries_total",
             "hits": "paged_core_prefix_cache_hits_total",
             "output_tokens": "paged_core_generation_tokens_total"}


def _counters(replica_url: str) -> dict[str, float]:
    """A replica's prefix-cache and generation counters, from its Prometheus ``/metrics``."""
    values = scrape(replica_url, list(_COUNTERS.values()))
    return {key: values[name] for key, name in _COUNTERS.items()}


def print_summary(results: dict[str, Any]) -> None:
    print(f"{results['replicas']} replicas ({results['adapter']}), {results['tenants']} tenants x "
          f"{results['requests_per_tenant']} requests, prefix {results['prefix_tokens']} tokens, "
          f"{results['kv_blocks_per_replica']} KV blocks per replica")
    print(f"{'policy':>18}{'hit rate':>10}{'TTFT p50':>10}{'TTFT p99':>10}{'tok/s':>8}  output share")
    for policy, r in results["policies"].items():
        total = sum(p["output_tokens"] for p in r["per_replica"]) or 1
        share = " ".join(f"{p['output_tokens'] / total:.0%}" for p in r["per_replica"])
        print(f"{policy:>18}{r['hit_rate']:>10.0%}{r['ttft_ms']['p50']:>9.0f}ms"
              f"{r['ttft_ms']['p99']:>9.0f}ms{r['output_tok_per_s']:>8.1f}  {share}")
    for policy, goals in results["goals"].items():
        print(f"{policy}: hit rate {goals['hit_rate_vs_single']:.2f}x single's; TTFT p50 "
              f"{goals['ttft_p50_speedup_vs_round_robin']:.2f}x better than round-robin; the "
              f"router's placements: {results['policies'][policy]['router_placements']}")


def plot(results: dict[str, Any], out_dir, name: str) -> None:
    fig, axes = new_figure(ncols=3, width=5.0)
    policies = list(results["policies"])
    runs = [results["policies"][p] for p in policies]
    axes[0][0].bar(policies, [r["hit_rate"] for r in runs])
    axes[0][0].set_ylabel("prefix-cache hit rate")
    for offset, point in ((-0.2, "p50"), (0.2, "p99")):
        axes[0][1].bar([i + offset for i in range(len(runs))],
                       [r["ttft_ms"][point] for r in runs], width=0.4, label=point)
    axes[0][1].set_xticks(range(len(runs)), policies)
    axes[0][1].set_ylabel("TTFT (ms)")
    axes[0][1].legend()
    axes[0][2].bar(policies, [r["output_tok_per_s"] for r in runs])
    axes[0][2].set_ylabel("output tok/s")
    for ax in axes[0]:
        ax.tick_params(axis="x", labelrotation=20)
    fig.suptitle(f"{results['replicas']} replicas, {results['tenants']} tenants x "
                 f"{results['prefix_tokens']}-token prefixes, {results['dtype']}")
    save_plot(fig, out_dir, name)


def readme_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [(policy, f"hit rate {r['hit_rate']:.0%}, TTFT p50 {r['ttft_ms']['p50']:.0f} ms / "
                     f"p99 {r['ttft_ms']['p99']:.0f} ms, {r['output_tok_per_s']:.1f} tok/s")
            for policy, r in result["policies"].items()]
    rows += [(f"{policy} vs single hit rate; vs round-robin TTFT p50",
              f"{goals['hit_rate_vs_single']:.2f}x; {goals['ttft_p50_speedup_vs_round_robin']:.2f}x")
             for policy, goals in result["goals"].items()]
    return rows
