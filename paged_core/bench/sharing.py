"""``bench sharing``: peak KV blocks of parallel sampling and of beam search vs independent requests.

Parallel: one request with ``SamplingParams(n=k, temperature=0.8, seed=...)``;
its ``k`` samples share the prompt's blocks by reference and copy a block only
when they write into a shared one (copy-on-write). Beam search: one request
with ``BeamSearchParams(beam_width=k, ignore_eos=True)``; its beams share the
prompt's blocks and every block of the common history of beams that forked
from each other. Independent: ``k`` separate requests with the same prompt,
i.e. the same ``k`` sequences with no sharing. All run on one engine with
prefix caching off, so the independent requests cannot share through the cache
either. Reported: the peak of ``stats()["kv_blocks_used"]`` over the steps, and
the % saved.
"""
from __future__ import annotations

import argparse
import random
import time
from typing import Any

from paged_core import BeamSearchParams, SamplingParams

from .engine_driver import make_engine, run_until_done, submit
from .report import new_figure, save_plot
from .workload import BenchRequest, corpus_token_ids, embedded_tokenizer, text_window

NAME = "sharing"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ns", default="2,4,6,8", help="numbers of samples to compare")
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=32)


def run(args: argparse.Namespace) -> dict[str, Any]:
    ns, prompt_len, output_len = (([2, 4], 40, 6) if args.quick else
                                  ([int(n) for n in args.ns.split(",")], args.prompt_len,
                                   args.output_len))
    corpus = corpus_token_ids(embedded_tokenizer())
    request = BenchRequest(text_window(corpus, random.Random(args.seed), prompt_len), output_len)
    engine = make_engine(args.dtype, enable_prefix_caching=False)
    block_size = engine.config.block_size
    rows = []
    for n in ns:
        parallel = _peak_blocks(engine, {"p": (request, _params(request, n, args.seed))})
        independent = _peak_blocks(engine, {f"i{k}": (request, _params(request, 1, args.seed + k))
                                            for k in range(n)})
        beam = _peak_blocks(engine, {"b": (request, BeamSearchParams(
            beam_width=n, max_tokens=request.output_len, ignore_eos=True))})
        rows.append({"n": n, "parallel_peak_blocks": parallel["peak_blocks"],
                     "independent_peak_blocks": independent["peak_blocks"],
                     "beam_peak_blocks": beam["peak_blocks"],
                     "parallel_seconds": parallel["seconds"],
                     "independent_seconds": independent["seconds"],
                     "beam_seconds": beam["seconds"],
                     "saved": 1 - parallel["peak_blocks"] / independent["peak_blocks"],
                     "beam_saved": 1 - beam["peak_blocks"] / independent["peak_blocks"]})
    return {"dtype": args.dtype, "block_size": block_size, "prompt_len": prompt_len,
            "output_len": output_len, "rows": rows}


def _params(request: BenchRequest, n: int, seed: int) -> SamplingParams:
    return SamplingParams(n=n, temperature=0.8, seed=seed, max_tokens=request.output_len,
                          ignore_eos=True)


def _peak_blocks(engine, jobs: dict[str, tuple[BenchRequest, SamplingParams | BeamSearchParams]]
                 ) -> dict[str, float]:
    peak = 0

    def sample(eng) -> None:
        nonlocal peak
        peak = max(peak, eng.stats()["kv_blocks_used"])

    start = time.perf_counter()
    for request_id, (request, params) in jobs.items():
        submit(engine, request_id, request, params)
    outputs = run_until_done(engine, sample)
    assert all(len(c.token_ids) == request.output_len
               for out in outputs.values() for c in out.outputs), "short output"
    return {"peak_blocks": peak, "seconds": time.perf_counter() - start}


def print_summary(results: dict[str, Any]) -> None:
    print(f"prompt {results['prompt_len']} tokens, {results['output_len']} output tokens per "
          f"sample, block size {results['block_size']}")
    print(f"{'n':>3}{'parallel blocks':>17}{'independent blocks':>20}{'saved':>8}"
          f"{'beam blocks':>13}{'saved':>8}")
    for r in results["rows"]:
        print(f"{r['n']:>3}{r['parallel_peak_blocks']:>17}{r['independent_peak_blocks']:>20}"
              f"{r['saved']:>8.1%}{r['beam_peak_blocks']:>13}{r['beam_saved']:>8.1%}")


def plot(results: dict[str, Any], out_dir, name: str) -> None:
    fig, axes = new_figure()
    ax = axes[0][0]
    ns = [r["n"] for r in results["rows"]]
    ax.plot(ns, [r["independent_peak_blocks"] for r in results["rows"]], marker="o",
            label="n independent requests")
    ax.plot(ns, [r["parallel_peak_blocks"] for r in results["rows"]], marker="o",
            label="one request, n samples (shared prompt, copy-on-write)")
    ax.plot(ns, [r["beam_peak_blocks"] for r in results["rows"]], marker="s",
            label="one request, beam search with n beams (forked block tables)")
    for r in results["rows"]:
        ax.annotate(f"-{r['saved']:.0%}", (r["n"], r["parallel_peak_blocks"]),
                    textcoords="offset points", xytext=(0, -14), ha="center")
        ax.annotate(f"-{r['beam_saved']:.0%}", (r["n"], r["beam_peak_blocks"]),
                    textcoords="offset points", xytext=(0, 6), ha="center")
    ax.set_ylim(0, max(r["independent_peak_blocks"] for r in results["rows"]) * 1.3)
    ax.set_xlabel("n (samples or beams)")
    ax.set_ylabel("peak KV blocks used")
    ax.set_title(f"Block sharing, {results['prompt_len']}-token prompt")
    ax.legend(loc="upper left")
    save_plot(fig, out_dir, name)


def readme_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    setup = (f"{result['prompt_len']}-token prompt, {result['output_len']} tokens per sample, "
             f"block size {result['block_size']}")
    return [("setup", setup)] + [(f"parallel sampling n={r['n']}: peak KV blocks vs independent",
             f"{r['parallel_peak_blocks']} vs {r['independent_peak_blocks']} "
             f"({r['saved']:.0%} saved)") for r in result["rows"]] + [
        (f"beam search beam_width={r['n']}: peak KV blocks vs independent",
         f"{r['beam_peak_blocks']} vs {r['independent_peak_blocks']} ({r['beam_saved']:.0%} saved)")
        for r in result["rows"]]
