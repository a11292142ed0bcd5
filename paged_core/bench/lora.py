"""``bench lora``: output tokens per second with 0, 1, 4 and 8 distinct LoRA adapters in the batch.

One long-tailed mix of requests (``workload.LONG_TAIL``, 32 requests; ``--quick``: 8 short
ones) on the embedded model, all submitted at once: first on an engine without LoRA (the
base alone), then on one with ``enable_lora`` (8 slots) where request ``i`` runs under
adapter ``i % k`` for ``k`` = 0 (LoRA on, every request on the base), 1, 4 and 8 distinct
adapters, each at rank 8 and at rank 64 (adapters over every attention and MLP projection,
made with PEFT). The cost of ``k`` adapters is ``1 - tok/s(k) / tok/s(base alone)``.
Each case runs after a warm-up, with the prefix cache reset between cases; ``--repeats R``
runs R rounds, each the base alone, every case (in reverse order on odd rounds), then the
base alone again: a case's cost in a round is against the mean of that round's two runs of
the base alone (so a machine drifting during a round weighs on no case more than another),
and its reported cost is the median over rounds.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from typing import Any

from .engine_driver import make_engine, run_until_done, submit
from .report import new_figure, save_plot
from .workload import LONG_TAIL, QUICK, WARMUP, embedded_tokenizer, sharegpt_like

NAME = "lora"
ADAPTER_COUNTS = (0, 1, 4, 8)
RANKS = (8, 64)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1,
                        help="rounds, each the base alone, every case, the base alone again")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ..lora.request import LoRARequest
    from ..models.embedded_model import embedded_model_folder
    from .lora_adapters import make_adapters

    spec = QUICK if args.quick else dataclasses.replace(LONG_TAIL, num_requests=args.num_requests)
    requests = sharegpt_like(dataclasses.replace(spec, seed=args.seed), embedded_tokenizer())
    counts = (0, 1, 4) if args.quick else ADAPTER_COUNTS
    repeats = max(1, getattr(args, "repeats", 1))
    results: dict[str, Any] = {"dtype": args.dtype, "num_requests": len(requests),
                               "output_tokens": sum(r.output_len for r in requests),
                               "repeats": repeats}
    base_engine = make_engine(args.dtype)
    with tempfile.TemporaryDirectory() as tmp:
        engines = {}  # rank -> (engine, its adapters)
        for rank in RANKS[:1] if args.quick else RANKS:
            folders = make_adapters(embedded_model_folder(), tmp, rank, list(range(max(counts))),
                                    scale=0.05)
            engines[rank] = (make_engine(args.dtype, enable_lora=True, max_loras=max(counts),
                                         max_lora_rank=rank),
                             [LoRARequest(f"r{rank}-{i}", i + 1, f) for i, f in enumerate(folders)])
        rounds = [_one_round(base_engine, engines, counts, requests, reverse=index % 2 == 1)
                  for index in range(repeats)]
    results["base_alone"] = statistics.median(r["base_alone"] for r in rounds)
    results["base_alone_runs_per_round"] = [r["base_alone_runs"] for r in rounds]
    results["base_alone_per_round"] = [r["base_alone"] for r in rounds]
    results["cases"] = [
        {"rank": rank, "adapters": count,
         "tok_per_s": statistics.median(r["cases"][rank, count] for r in rounds),
         "tok_per_s_per_round": [r["cases"][rank, count] for r in rounds],
         # each round's case against that round's mean base alone, then the median
         "cost": statistics.median(1 - r["cases"][rank, count] / r["base_alone"]
                                   for r in rounds)}
        for rank in engines for count in counts]
    return results


def _one_round(base_engine, engines, counts, requests, reverse: bool) -> dict[str, Any]:
    """The base alone, every (rank, adapter count) case one after another (last to first if
    ``reverse``), the base alone again; ``base_alone`` is the mean of its two runs."""
    n = len(requests)
    cases = [(rank, count) for rank in engines for count in counts]
    before = _tok_per_s(base_engine, requests, [None] * n)
    result = {"cases": {}}
    for rank, count in reversed(cases) if reverse else cases:
        engine, adapters = engines[rank]
        loras = [adapters[i % count] if count else None for i in range(n)]
        result["cases"][rank, count] = _tok_per_s(engine, requests, loras)
    after = _tok_per_s(base_engine, requests, [None] * n)
    result["base_alone_runs"] = [before, after]
    result["base_alone"] = (before + after) / 2
    return result


def _tok_per_s(engine, requests, loras) -> float:
    for i, request in enumerate(WARMUP):
        submit(engine, f"warmup-{i}", request, lora_request=loras[0])
    run_until_done(engine)
    engine.reset_prefix_cache()
    start = time.perf_counter()
    for i, (request, lora) in enumerate(zip(requests, loras)):
        submit(engine, str(i), request, lora_request=lora)
    finished = run_until_done(engine)
    seconds = time.perf_counter() - start
    return sum(len(out.outputs[0].token_ids) for out in finished.values()) / seconds


def print_summary(results: dict[str, Any]) -> None:
    print(f"{results['num_requests']} requests, {results['output_tokens']} output tokens, "
          f"{results['dtype']}; base alone (LoRA off): {results['base_alone']:.1f} tok/s")
    print(f"{'rank':>6}{'adapters':>10}{'tok/s':>10}{'cost':>8}")
    for case in results["cases"]:
        print(f"{case['rank']:>6}{case['adapters']:>10}{case['tok_per_s']:>10.1f}"
              f"{case['cost']:>8.0%}")


def plot(results: dict[str, Any], out_dir, name: str) -> None:
    fig, axes = new_figure()
    ax = axes[0][0]
    for rank in sorted({c["rank"] for c in results["cases"]}):
        rows = [c for c in results["cases"] if c["rank"] == rank]
        ax.plot([c["adapters"] for c in rows], [c["tok_per_s"] for c in rows], marker="o",
                label=f"rank {rank}")
    ax.axhline(results["base_alone"], color="k", ls="--", label="base alone (LoRA off)")
    ax.set_xlabel("distinct adapters in the batch")
    ax.set_ylabel("output tok/s")
    ax.set_title(f"Multi-LoRA, {results['num_requests']} requests, {results['dtype']}")
    ax.legend()
    save_plot(fig, out_dir, name)


def readme_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [("base alone (LoRA off), output tok/s", f"{result['base_alone']:.1f}")]
    for case in result["cases"]:
        rows.append((f"rank {case['rank']}, {case['adapters']} adapters",
                     f"{case['tok_per_s']:.1f} tok/s (cost {case['cost']:.0%})"))
    return rows

