"""``bench memory``: how much reserved KV memory holds real tokens, paged vs contiguous.

One workload runs under a fixed KV budget (``--kv-tokens`` slots) with block
sizes 8, 16 and 32. After every engine step we sample ``stats()["kv_blocks_used"]``
(paged reservation) and the live sequences' computed tokens (real K/V). The
contiguous figures are computed for the very same live sequences at the very
same steps, as if each had reserved one contiguous region up front:

- ``contiguous (max_model_len)``: ``max_model_len`` slots per request (how
  static-shape servers pre-allocate);
- ``contiguous (prompt+max_tokens)``: exactly the request's own cap.

Waste = 1 - sum(live tokens) / sum(reserved slots) over all sampled steps.
"Fits" = requests that can hold memory at once under the budget: measured peak
of running requests for paged, ``budget // reservation`` (FCFS, in workload
order) for contiguous. The vLLM paper (Kwon et al., 2023) reports 60-80% waste
for contiguous pre-allocation and under 4% for paged attention.
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from .engine_driver import live_sequences, make_engine, run_until_done, submit
from .report import new_figure, save_plot
from .workload import QUICK, BenchRequest, WorkloadSpec, embedded_tokenizer, sharegpt_like, summarize

NAME = "memory"
BLOCK_SIZES = (8, 16, 32)
CLAIMS = {"contiguous": "60-80% wasted (vLLM paper)", "paged": "< 4% wasted (vLLM paper)"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--kv-tokens", type=int, default=4096, help="KV budget in token slots")
    parser.add_argument("--max-model-len", type=int, default=2048)


def _sizes(args: argparse.Namespace) -> tuple[WorkloadSpec, int, int]:
    if args.quick:
        return dataclasses.replace(QUICK, seed=args.seed), 256, 128
    spec = WorkloadSpec(num_requests=args.num_requests, seed=args.seed)
    return spec, args.kv_tokens, args.max_model_len


def run(args: argparse.Namespace) -> dict[str, Any]:
    spec, kv_tokens, max_model_len = _sizes(args)
    requests = sharegpt_like(spec, embedded_tokenizer())
    paged = {f"paged (block {bs})": _run_paged(args.dtype, bs, kv_tokens, max_model_len, requests)
             for bs in BLOCK_SIZES}
    traces = {name: entry.pop("trace") for name, entry in paged.items()}
    contiguous = _contiguous(traces["paged (block 16)"], requests, kv_tokens, max_model_len)
    return {"workload": summarize(requests), "kv_tokens": kv_tokens, "max_model_len": max_model_len,
            "dtype": args.dtype, "layouts": {**paged, **contiguous}, "claims": CLAIMS}


def _run_paged(dtype: str, block_size: int, kv_tokens: int, max_model_len: int,
               requests: list[BenchRequest]) -> dict[str, Any]:
    engine = make_engine(dtype, block_size=block_size, num_kv_blocks=kv_tokens // block_size,
                         max_model_len=max_model_len, enable_prefix_caching=False, max_num_seqs=256)
    for i, request in enumerate(requests):
        submit(engine, str(i), request)
    live_total = reserved_total = peak_running = 0
    trace: list[list[tuple[int, int]]] = []  # per step: (request index, live tokens)

    def sample(eng) -> None:
        nonlocal live_total, reserved_total, peak_running
        seqs = live_sequences(eng)
        live_total += sum(s.num_computed_tokens for s in seqs)
        reserved_total += eng.stats()["kv_blocks_used"] * block_size
        peak_running = max(peak_running, len(seqs))
        trace.append([(int(s.request.request_id), s.num_computed_tokens) for s in seqs])

    run_until_done(engine, sample)
    stats = engine.stats()
    return {"block_size": block_size, "fits": peak_running, "steps": len(trace),
            "utilization": live_total / reserved_total, "waste": 1 - live_total / reserved_total,
            "num_preemptions": stats["num_preemptions"], "trace": trace}


def _contiguous(trace: list[list[tuple[int, int]]], requests: list[BenchRequest], kv_tokens: int,
                max_model_len: int) -> dict[str, Any]:
    """Reservations of the same live sequences at the same steps, one region per request."""
    caps = [r.prompt_len + r.output_len for r in requests]
    layouts = {"contiguous (max_model_len)": lambda i: max_model_len,
               "contiguous (prompt+max_tokens)": lambda i: caps[i]}
    out = {}
    live_total = sum(tokens for step in trace for _, tokens in step)
    for name, reserve in layouts.items():
        reserved_total = sum(reserve(i) for step in trace for i, _ in step)
        fits, used = 0, 0
        while fits < len(requests) and used + reserve(fits) <= kv_tokens:
            used += reserve(fits)
            fits += 1
        out[name] = {"fits": fits, "utilization": live_total / reserved_total,
                     "waste": 1 - live_total / reserved_total}
    return out


def print_summary(results: dict[str, Any]) -> None:
    print(f"KV budget {results['kv_tokens']} token slots, max_model_len {results['max_model_len']}, "
          f"{results['workload']['num_requests']} requests")
    print(f"{'layout':<34}{'fits at once':>14}{'waste':>10}   claim")
    for name, entry in results["layouts"].items():
        print(f"{name:<34}{entry['fits']:>14}{entry['waste']:>10.1%}   {_claim(name)}")


def plot(results: dict[str, Any], out_dir, name: str) -> None:
    fig, axes = new_figure(ncols=2, width=5.5)
    names = list(results["layouts"])
    colors = ["tab:blue" if n.startswith("paged") else "tab:gray" for n in names]
    waste = [results["layouts"][n]["waste"] * 100 for n in names]
    axes[0][0].barh(names, waste, color=colors)
    axes[0][0].set_xlabel("reserved KV memory not holding tokens (%)")
    axes[0][1].barh(names, [results["layouts"][n]["fits"] for n in names], color=colors)
    axes[0][1].set_xlabel(f"requests fitting in {results['kv_tokens']} slots")
    axes[0][1].set_yticks([])
    fig.suptitle("KV-cache memory: paged blocks vs contiguous pre-allocation")
    save_plot(fig, out_dir, name)


def _claim(layout: str) -> str:
    return CLAIMS["paged" if layout.startswith("paged") else "contiguous"]


def readme_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    setup = (f"{result['workload']['num_requests']} requests, {result['kv_tokens']} KV token "
             f"slots, max_model_len {result['max_model_len']}")
    return [("setup", setup)] + [
        (f"KV waste, {name}",
         f"{entry['waste']:.1%}, fits {entry['fits']} at once (claim: {_claim(name)})")
        for name, entry in result["layouts"].items()]
