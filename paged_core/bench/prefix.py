"""``bench prefix``: time to first token with a long shared system prompt, prefix caching on vs off.

Every request is the same system prompt (``--system-tokens`` tokens of text)
followed by its own user turn (32-64 tokens), and asks for a few tokens. The
requests run one after another, so TTFT is prefill time, not queueing: the
first is cold in both engines; with caching on, the later ones reuse the
system prompt's blocks and compute only their own tail. TTFT is the engine's
own ``RequestMetrics`` (arrival to first token). Hit rate is
``prefix_cache_hits / prefix_cache_queries`` (tokens) from ``stats()``.
"""
from __future__ import annotations

import argparse
import random
import statistics
from typing import Any

from .engine_driver import make_engine, run_until_done, submit
from .report import new_figure, save_plot
from .workload import WARMUP, BenchRequest, corpus_token_ids, embedded_tokenizer, text_window

NAME = "prefix"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--system-tokens", type=int, default=1536)
    parser.add_argument("--num-requests", type=int, default=8)
    parser.add_argument("--output-len", type=int, default=8)


def shared_prefix_requests(args: argparse.Namespace) -> tuple[int, list[BenchRequest]]:
    """(system prompt length, requests)."""
    system_tokens, num, out_len = ((128, 3, 4) if args.quick else
                                   (args.system_tokens, args.num_requests, args.output_len))
    rng = random.Random(args.seed)
    corpus = corpus_token_ids(embedded_tokenizer())
    system = text_window(corpus, rng, system_tokens)
    return system_tokens, [BenchRequest(system + text_window(corpus, rng, rng.randint(32, 64)),
                                        out_len) for _ in range(num)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    system_tokens, requests = shared_prefix_requests(args)
    modes = {}
    for caching in (False, True):
        modes["on" if caching else "off"] = _run_mode(args.dtype, caching, requests)
    off, on = modes["off"]["warm_ttft_ms_median"], modes["on"]["warm_ttft_ms_median"]
    return {"dtype": args.dtype, "system_tokens": system_tokens,
            "prompt_lens": [r.prompt_len for r in requests], "modes": modes,
            "warm_ttft_speedup": off / on}


def _run_mode(dtype: str, caching: bool, requests: list[BenchRequest]) -> dict[str, Any]:
    engine = make_engine(dtype, enable_prefix_caching=caching)
    for i, request in enumerate(WARMUP):
        submit(engine, f"warmup-{i}", request)
    run_until_done(engine)
    before = engine.stats()
    ttfts = []
    for i, request in enumerate(requests):
        submit(engine, str(i), request)
        metrics = run_until_done(engine)[str(i)].metrics
        ttfts.append((metrics.first_token_time - metrics.arrival_time) * 1000)
    stats = engine.stats()
    queries = stats["prefix_cache_queries"] - before["prefix_cache_queries"]
    hits = stats["prefix_cache_hits"] - before["prefix_cache_hits"]
    return {"ttft_ms": ttfts, "cold_ttft_ms": ttfts[0],
            "warm_ttft_ms_median": statistics.median(ttfts[1:]),
            "prefix_cache_queries": queries, "prefix_cache_hits": hits,
            "hit_rate": hits / queries if queries else 0.0}


def print_summary(results: dict[str, Any]) -> None:
    print(f"shared system prompt of {results['system_tokens']} tokens, "
          f"{len(results['prompt_lens'])} requests one after another")
    print(f"{'prefix caching':<16}{'cold TTFT ms':>14}{'warm TTFT ms (median)':>24}{'hit rate':>10}")
    for mode, m in results["modes"].items():
        print(f"{mode:<16}{m['cold_ttft_ms']:>14.0f}{m['warm_ttft_ms_median']:>24.0f}"
              f"{m['hit_rate']:>10.1%}")
    print(f"warm TTFT speedup with caching: {results['warm_ttft_speedup']:.1f}x")


def plot(results: dict[str, Any], out_dir, name: str) -> None:
    fig, axes = new_figure()
    ax = axes[0][0]
    for mode, m in results["modes"].items():
        ax.plot(range(1, len(m["ttft_ms"]) + 1), m["ttft_ms"], marker="o",
                label=f"prefix caching {mode} (hit rate {m['hit_rate']:.0%})")
    ax.set_xlabel("request (in order)")
    ax.set_ylabel("TTFT (ms)")
    ax.set_yscale("log")
    ax.set_title(f"Shared {results['system_tokens']}-token system prompt")
    ax.legend()
    save_plot(fig, out_dir, name)


def readme_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    on, off = result["modes"]["on"], result["modes"]["off"]
    return [(f"{result['system_tokens']}-token shared system prompt: warm TTFT off -> on (ms)",
             f"{off['warm_ttft_ms_median']:.0f} -> {on['warm_ttft_ms_median']:.0f} "
             f"({result['warm_ttft_speedup']:.1f}x), hit rate {on['hit_rate']:.0%}")]
