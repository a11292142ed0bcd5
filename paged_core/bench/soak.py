"""``bench soak``: a long mixed load against a real server, then check that nothing leaked.

``--requests`` requests of ``soak_mix.make_mix`` (mixed lengths, ~30% client
disconnects at random points, short timeouts, priorities and tenants, n>1,
malformed bodies) run ``--concurrency`` at a time against a server started
with a small KV cache (so preemption happens), a short waiting queue (so some
get 429), the priority policy with tenant fairness, and a 60 s server deadline. Reported: how many
completed / were rejected (429) / timed out / were aborted by their client /
were refused as malformed / failed, p50/p99 latency per outcome, the server's
RSS over time (``process_resident_memory_bytes`` from ``/metrics``), and at the
end the engine's KV blocks used, running and waiting requests (all must be 0).
``--batch-invariant`` starts the server in batch-invariant mode and checks it: a few
greedy probes are answered once on the idle server, then again and again while the
mix runs; every answer under load must be the same text (``batch_invariance``).

Target: ``--url http://HOST:PORT`` (a running server), else a server this
command starts (``paged-core serve --adapter litserve|bentoml``), or
``--in-process`` (the OpenAI app on an ``AsyncEngine`` in this process, no
sockets: what the test suite runs).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from typing import Any, AsyncIterator

from .metrics_text import sample_value
from .report import new_figure, percentiles, save_plot
from .soak_mix import OUTCOMES, make_mix, send

NAME = "soak"
# request_timeout: under sustained overload the priority policy starves the lowest level
# (as vLLM's does); a server deadline turns that into 408s instead of endless waits
SERVER_SETTINGS = {"num_kv_blocks": 64, "max_num_seqs": 16, "max_waiting_requests": 32,
                   "scheduling_policy": "priority", "tenant_fairness": True,
                   "max_model_len": 512, "request_timeout": 60.0}
# Greedy probes of batch-invariant mode: prompts of a few lengths, answered alone then under load.
PROBE_PROMPTS = ("Hello", "Write one sentence about the sea and the ships that sail on it",
                 "List the planets of the solar system in order of their distance from the sun, "
                 "starting with the closest one, and say one thing about each")
PROBE_TOKENS = 24
_FINAL_GAUGES = {"kv_blocks_used": "paged_core_kv_blocks_used",
                 "num_running": "paged_core_num_requests_running",
                 "num_waiting": "paged_core_num_requests_waiting"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=None, help="base URL of a running server (no /v1)")
    parser.add_argument("--adapter", choices=("litserve", "bentoml"), default="litserve")
    parser.add_argument("--in-process", action="store_true",
                        help="the OpenAI app on an AsyncEngine in this process")
    parser.add_argument("--model", default=None, help="model folder (default: embedded)")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=48)
    parser.add_argument("--hang-timeout", type=float, default=120.0,
                        help="seconds without an answer that count as a hang")
    parser.add_argument("--rss-interval", type=float, default=2.0)
    parser.add_argument("--batch-invariant", action="store_true",
                        help="serve in batch-invariant mode and check greedy probes under load")


def run(args: argparse.Namespace) -> dict[str, Any]:
    num = min(200, args.requests) if args.quick else args.requests
    mix = make_mix(num, args.seed)
    settings = dict(SERVER_SETTINGS, dtype=args.dtype)
    if args.batch_invariant:
        settings["batch_invariant"] = True
    if args.model:
        settings["model"] = args.model
    return asyncio.run(_soak(args, mix, settings))


async def _soak(args: argparse.Namespace, mix: list, settings: dict[str, Any]) -> dict[str, Any]:
    async with _client(args, settings) as client:
        rss: list[tuple[float, float]] = []
        sampler = asyncio.ensure_future(_sample_rss(client, args.rss_interval, rss))
        probes = ({p: await _greedy_text(client, p) for p in PROBE_PROMPTS}
                  if settings.get("batch_invariant") else {})
        start = time.perf_counter()
        driving = asyncio.ensure_future(_drive(client, mix, args.concurrency, args.hang_timeout))
        invariance = await _probe_under_load(client, probes, driving)
        outcomes = await driving
        duration = time.perf_counter() - start
        sampler.cancel()
        final = await _settled_gauges(client)
        preemptions = sample_value(await _metrics_text(client), "paged_core_num_preemptions_total")
        alive = (await client.get("/v1/models")).status_code == 200
    counts = {kind: sum(o.kind == kind for o in outcomes) for kind in OUTCOMES}
    latency = {kind: percentiles([o.latency * 1000 for o in outcomes if o.kind == kind], (50, 99))
               for kind in OUTCOMES if counts[kind]}
    errors = [o.detail for o in outcomes if o.kind == "error"][:20]
    return {"settings": settings, "requests": len(mix), "concurrency": args.concurrency,
            "duration_s": duration, "counts": counts, "latency_ms": latency,
            "rss_mb": [(t, m / 2**20) for t, m in rss], "final": final, "server_alive": alive,
            "preemptions": preemptions, "batch_invariance": invariance,
            "error_samples": errors, "leak_free": all(v == 0 for v in final.values())}


@contextlib.asynccontextmanager
async def _client(args: argparse.Namespace, settings: dict[str, Any]) -> AsyncIterator[Any]:
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    if args.in_process:
        from paged_core import AsyncEngine, EngineConfig
        from paged_core.openai import build_openai_app

        engine = AsyncEngine(EngineConfig(**settings))
        transport = httpx.ASGITransport(app=build_openai_app(engine))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://soak",
                                         timeout=args.hang_timeout) as client:
                yield client
        finally:
            await engine.shutdown()
        return
    with contextlib.ExitStack() as stack:
        url = args.url
        if url is None:
            from .server import running_server

            flags = [f"--{k.replace('_', '-')}={str(v).lower() if isinstance(v, bool) else v}"
                     for k, v in settings.items() if k != "dtype"]
            url = stack.enter_context(running_server(args.adapter, args.dtype, extra_args=flags))
            url = url.removesuffix("/v1")
        async with httpx.AsyncClient(base_url=url, timeout=args.hang_timeout,
                                     limits=limits) as client:
            yield client


async def _drive(client: Any, mix: list, concurrency: int, hang_s: float) -> list:
    outcomes: list = [None] * len(mix)
    next_index = iter(range(len(mix)))

    async def worker() -> None:
        for i in next_index:
            outcomes[i] = await send(client, mix[i], hang_s)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return outcomes


async def _greedy_text(client: Any, prompt: str) -> str | None:
    """The greedy completion of ``prompt`` (``None`` if the server refused or timed it out)."""
    body = {"prompt": prompt, "max_tokens": PROBE_TOKENS, "temperature": 0, "ignore_eos": True}
    response = await client.post("/v1/completions", json=body)
    return response.json()["choices"][0]["text"] if response.status_code == 200 else None


async def _probe_under_load(client: Any, alone: dict[str, str | None],
                            driving: asyncio.Future) -> dict[str, int] | None:
    """Re-ask the probes until the mix is done: how many answers under load were checked and
    how many equal the idle server's (``None`` without probes)."""
    if not alone:
        return None
    checked = identical = 0
    while not driving.done():
        for prompt, expected in alone.items():
            text = await _greedy_text(client, prompt)  # None: refused (429), asked again later
            if text is not None and expected is not None and not driving.done():
                checked += 1
                identical += text == expected
    return {"checked": checked, "identical": identical}


async def _metrics_text(client: Any) -> str:
    for path in ("/metrics", "/engine/metrics"):
        response = await client.get(path)
        if response.status_code == 200 and "paged_core_" in response.text:
            return response.text
    return ""


async def _sample_rss(client: Any, interval: float, out: list[tuple[float, float]]) -> None:
    start = time.perf_counter()
    while True:
        value = sample_value(await _metrics_text(client), "process_resident_memory_bytes")
        if value is not None:
            out.append((time.perf_counter() - start, value))
        await asyncio.sleep(interval)


async def _settled_gauges(client: Any, timeout_s: float = 10.0) -> dict[str, float | None]:
    """KV blocks used, running and waiting once the aborts of departed clients went through."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = await _metrics_text(client)
        final = {key: sample_value(text, name) for key, name in _FINAL_GAUGES.items()}
        if all(v == 0 for v in final.values()) or time.monotonic() > deadline:
            return final
        await asyncio.sleep(0.1)


def rss_growth_mb(result: dict[str, Any]) -> float | None:
    """RSS at the end minus RSS after warm-up (the first quarter of the run)."""
    series = result["rss_mb"]
    if len(series) < 4:
        return None
    return series[-1][1] - series[len(series) // 4][1]


def print_summary(results: dict[str, Any]) -> None:
    counts = ", ".join(f"{k} {v}" for k, v in results["counts"].items())
    print(f"soak: {results['requests']} requests in {results['duration_s']:.1f} s: {counts}")
    for kind, lat in results["latency_ms"].items():
        print(f"  {kind:12s} p50 {lat['p50']:9.1f} ms  p99 {lat['p99']:9.1f} ms")
    growth = rss_growth_mb(results)
    if growth is not None:
        print(f"  server RSS after warm-up: {results['rss_mb'][len(results['rss_mb']) // 4][1]:.0f}"
              f" MB, growth to the end {growth:+.1f} MB")
    if results["batch_invariance"] is not None:
        probes = results["batch_invariance"]
        print(f"  batch invariance: {probes['identical']} of {probes['checked']} greedy probes "
              f"under load gave the idle server's text")
    print(f"  at the end: {results['final']}, {results['preemptions']} preemptions in all, "
          f"server alive: {results['server_alive']}")
    for detail in results["error_samples"]:
        print(f"  error: {detail}")


def plot(results: dict[str, Any], out_dir, name: str) -> None:
    if not results["rss_mb"]:
        return
    fig, axes = new_figure()
    ax = axes[0][0]
    ax.plot([t for t, _ in results["rss_mb"]], [m for _, m in results["rss_mb"]])
    ax.set_xlabel("seconds into the soak")
    ax.set_ylabel("server RSS (MB)")
    ax.set_title(f"bench soak: {results['requests']} requests")
    save_plot(fig, out_dir, name)
