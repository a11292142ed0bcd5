"""``bench serve``: online latency through an adapter's OpenAI endpoint.

Scenarios: Poisson arrivals at each ``--rates`` value (requests/s, seeded), then
a burst of ``--burst`` requests sent at once. Per scenario: request and output
token throughput, and p50/p90/p99 of time to first token (TTFT), inter-token
latency (ITL: gaps between streamed chunks), time per output token (TPOT) and
end-to-end latency, in milliseconds.

Target: ``--url http://HOST:PORT/v1`` (a running server), or else a server this
command starts itself (``paged-core serve --adapter litserve|bentoml``) and
stops afterwards, or ``--in-process``: the engine's ``AsyncEngine`` without HTTP.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import random
import time
from typing import Any

from .clients import HTTPClient, InProcessClient, RequestRecord
from .report import new_figure, percentiles, save_plot
from .server import running_server
from .workload import QUICK, BenchRequest, WorkloadSpec, embedded_tokenizer, sharegpt_like, summarize

NAME = "serve"
METRICS = ("ttft", "itl", "tpot", "e2e")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=None, help="OpenAI base URL of a running server")
    parser.add_argument("--adapter", choices=("litserve", "bentoml"), default="litserve",
                        help="adapter to start when no --url is given")
    parser.add_argument("--in-process", action="store_true",
                        help="drive AsyncEngine in this process instead of a server")
    parser.add_argument("--rates", default="0.5,1,2", help="Poisson request rates (req/s)")
    parser.add_argument("--requests-per-rate", type=int, default=24)
    parser.add_argument("--burst", type=int, default=100, help="requests sent at once")
    parser.add_argument("--prompt-median", type=int, default=WorkloadSpec.prompt_median)
    parser.add_argument("--output-median", type=int, default=WorkloadSpec.output_median)


def workload(args: argparse.Namespace) -> tuple[list[float], int, int, WorkloadSpec]:
    """(rates, requests per rate, burst size, lengths) for full or ``--quick`` runs."""
    if args.quick:
        return [4.0], 4, 6, dataclasses.replace(QUICK, num_requests=6, seed=args.seed)
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    n = max(args.requests_per_rate, args.burst)
    return rates, args.requests_per_rate, args.burst, WorkloadSpec(
        num_requests=n, prompt_median=args.prompt_median, output_median=args.output_median,
        seed=args.seed)


def run(args: argparse.Namespace) -> dict[str, Any]:
    rates, per_rate, burst, spec = workload(args)
    requests = sharegpt_like(spec, embedded_tokenizer())
    with _target(args) as (target, make_client):
        scenarios = asyncio.run(_run_scenarios(make_client, requests, rates, per_rate, burst, args.seed))
    return {"target": target, "dtype": args.dtype, "workload": summarize(requests),
            "scenarios": scenarios}


@contextlib.contextmanager
def _target(args: argparse.Namespace):
    """Yields (description, factory of a client bound to the running event loop)."""
    if args.in_process:
        from paged_core import AsyncEngine

        yield "in-process AsyncEngine", lambda: InProcessClient(AsyncEngine(dtype=args.dtype))
    elif args.url:
        yield f"server at {args.url}", lambda: HTTPClient(args.url)
    else:
        with running_server(args.adapter, args.dtype) as url:
            yield f"paged-core serve --adapter {args.adapter}", lambda: HTTPClient(url)


async def _run_scenarios(make_client, requests: list[BenchRequest], rates: list[float],
                         per_rate: int, burst: int, seed: int) -> list[dict[str, Any]]:
    client = make_client()
    try:
        await asyncio.gather(*(client.send(BenchRequest(r.prompt_token_ids[:16], 2))
                               for r in requests[:2]))  # warm-up
        results = []
        for rate in rates:
            rng = random.Random(seed)
            gaps = [rng.expovariate(rate) for _ in range(per_rate)]
            records, seconds = await _drive(client, requests[:per_rate], f"rate {rate:g}/s", gaps)
            results.append(_scenario(f"poisson {rate:g} req/s", rate, records, seconds))
        records, seconds = await _drive(client, requests[:burst], f"burst {burst}", [0.0] * burst)
        results.append(_scenario(f"burst {burst}", None, records, seconds))
        return results
    finally:
        await client.close()


async def _drive(client, requests: list[BenchRequest], label: str,
                 gaps: list[float]) -> tuple[list[RequestRecord], float]:
    """Send each request, then wait its gap (Poisson: exponential gaps; burst: none).

    Returns the records and the wall seconds from the first send to the last finish.
    """
    from tqdm.auto import tqdm

    bar = tqdm(total=len(requests), desc=label, unit="req", dynamic_ncols=True)

    async def one(request: BenchRequest) -> RequestRecord:
        record = await client.send(request)
        bar.update(1)
        return record

    start = time.perf_counter()
    tasks = []
    for request, gap in zip(requests, gaps):
        tasks.append(asyncio.create_task(one(request)))
        if gap:
            await asyncio.sleep(gap)
    records = await asyncio.gather(*tasks)
    bar.close()
    return list(records), time.perf_counter() - start


def _scenario(label: str, rate: float | None, records: list[RequestRecord],
              seconds: float) -> dict[str, Any]:
    ok = [r for r in records if r.ok]
    values = {
        "ttft": [r.ttft for r in ok], "e2e": [r.e2e for r in ok],
        "itl": [gap for r in ok for gap in r.itls],
        "tpot": [r.tpot for r in ok if r.tpot is not None],
    }
    errors = sorted({r.error for r in records if not r.ok})
    output_tokens = sum(r.output_tokens for r in ok)
    return {
        "label": label, "rate": rate, "num_requests": len(records), "completed": len(ok),
        "failed": len(records) - len(ok), "errors": errors[:5], "seconds": seconds,
        "request_throughput": len(ok) / seconds, "output_tok_s": output_tokens / seconds,
        **{f"{m}_ms": {k: v * 1000 for k, v in percentiles(values[m]).items()} for m in METRICS},
    }


def print_summary(results: dict[str, Any]) -> None:
    print(f"target: {results['target']}")
    print(f"{'scenario':<22}{'ok':>5}{'req/s':>8}{'tok/s':>8}"
          f"{'TTFT p50/p99 ms':>20}{'ITL p50/p99 ms':>18}{'E2E p50/p99 ms':>20}")
    for s in results["scenarios"]:
        cells = [f"{s[m + '_ms'].get('p50', float('nan')):.0f}/{s[m + '_ms'].get('p99', float('nan')):.0f}"
                 for m in ("ttft", "itl", "e2e")]
        print(f"{s['label']:<22}{s['completed']:>5}{s['request_throughput']:>8.2f}"
              f"{s['output_tok_s']:>8.1f}{cells[0]:>20}{cells[1]:>18}{cells[2]:>20}")


def plot(results: dict[str, Any], out_dir, name: str) -> None:
    """TTFT, ITL and end-to-end percentiles per scenario."""
    fig, axes = new_figure(ncols=3, width=4.5)
    labels = [s["label"] for s in results["scenarios"]]
    for ax, metric in zip(axes[0], ("ttft", "itl", "e2e")):
        for p in ("p50", "p90", "p99"):
            ax.plot(labels, [s[f"{metric}_ms"].get(p, float("nan")) for s in results["scenarios"]],
                    marker="o", label=p)
        ax.set_title(f"{metric.upper()} (ms)")
        ax.tick_params(axis="x", rotation=30)
        ax.legend()
    fig.suptitle(f"Online serving: {results['target']}")
    save_plot(fig, out_dir, name)


def readme_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for s in result["scenarios"]:
        rows.append((f"serve {s['label']}: TTFT / ITL / E2E p50 (p99) ms",
                     " / ".join(f"{s[m + '_ms'].get('p50', float('nan')):.0f} "
                                f"({s[m + '_ms'].get('p99', float('nan')):.0f})"
                                for m in ("ttft", "itl", "e2e"))
                     + f", {s['output_tok_s']:.1f} tok/s"))
    return rows
