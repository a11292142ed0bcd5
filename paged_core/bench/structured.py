"""``bench structured``: throughput with JSON-schema constraints vs none, and grammar compile time.

Workload: chat prompts, each asking for one of a set of JSON schemas (nested
objects, arrays, enums, bounded numbers, ``$ref``), greedy. The constrained run
goes first; each request's output length there becomes the exact length
(``ignore_eos`` + ``max_tokens``) of the same request unconstrained, so both
runs generate the same tokens per request on the same engine: the difference is
the cost of the grammar (bitmask fill, apply, accept). Runs go constrained,
free, free, constrained, and each side reports the mean of its two runs. Compile time: reading the
vocabulary into xgrammar (once per engine), each schema on a fresh compiler
(cold), and again (xgrammar's cache).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

from paged_core import SamplingParams, StructuredOutputsParams
from paged_core.structured_outputs import GrammarCompilerCache

from .engine_driver import make_engine, run_until_done
from .report import new_figure, save_plot

NAME = "structured"

_STR = {"type": "string", "maxLength": 16}
_INT = {"type": "integer", "minimum": 0, "maximum": 1000}
SCHEMAS = [
    {"type": "object", "properties": {"name": _STR, "age": _INT}, "required": ["name", "age"]},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "id": _INT, "email": _STR}, "required": ["id", "email"]}, "active": {"type": "boolean"}},
     "required": ["user", "active"]},
    {"type": "object", "properties": {"scores": {"type": "array", "items": _INT, "minItems": 1,
                                                 "maxItems": 5}}, "required": ["scores"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                      "celsius": {"type": "number", "minimum": -50,
                                                  "maximum": 50}},
     "required": ["color", "celsius"]},
    {"$defs": {"p": {"type": "object", "properties": {"x": _INT, "y": _INT},
                     "required": ["x", "y"]}},
     "type": "object", "properties": {"start": {"$ref": "#/$defs/p"}, "end": {"$ref": "#/$defs/p"}},
     "required": ["start", "end"]},
    {"type": "object", "properties": {"items": {"type": "array", "maxItems": 3, "items": {
        "type": "object", "properties": {"name": _STR, "qty": _INT}, "required": ["name", "qty"]}}},
     "required": ["items"]},
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-requests", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=96)


def run(args: argparse.Namespace) -> dict[str, Any]:
    num_requests = len(SCHEMAS) if args.quick else args.num_requests
    max_tokens = 64 if args.quick else args.max_tokens
    engine = make_engine(args.dtype)
    tokenizer = engine.tokenizer
    prompts = [tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Reply in JSON with {', '.join(s['required'])} ({i})."}],
        add_generation_prompt=True, tokenize=True, return_dict=False)
        for i, s in ((i, SCHEMAS[i % len(SCHEMAS)]) for i in range(num_requests))]
    constraints = [StructuredOutputsParams(json=SCHEMAS[i % len(SCHEMAS)])
                   for i in range(num_requests)]
    load_before = os.getloadavg()[0]
    compile_times = _compile_times(engine)
    _timed(engine, prompts[:2], [SamplingParams(temperature=0, max_tokens=4)] * 2)  # warm-up
    constrained_params = [SamplingParams(temperature=0, max_tokens=max_tokens,
                                         structured_outputs=c) for c in constraints]
    first = _timed(engine, prompts, constrained_params)
    lengths = first.pop("lengths")
    valid = sum(_parses(text) for text in first.pop("texts"))
    free_params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    # A B B A: a load that drifts linearly during the runs costs both sides alike
    free_runs = [_timed(engine, prompts, free_params) for _ in range(2)]
    last = _timed(engine, prompts, constrained_params)
    constrained, free = _mean([first, last]), _mean(free_runs)
    overhead = constrained["seconds"] / free["seconds"] - 1
    return {"dtype": args.dtype, "num_requests": num_requests, "num_schemas": len(SCHEMAS),
            "max_tokens": max_tokens, "valid_json": valid, "constrained": constrained,
            "unconstrained": free, "overhead": overhead, "compile": compile_times,
            "load_average_before": load_before, "notes": [
                f"load average {load_before:.1f} on {os.cpu_count()} cores before the run: "
                "the overhead is the difference of two timed runs, so other work on the "
                "machine shows up in it; rerun with more requests on an idle machine"]}


def _mean(runs: list[dict[str, Any]]) -> dict[str, Any]:
    seconds = statistics.mean(r["seconds"] for r in runs)
    tokens = runs[0]["tokens"]
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
            "mask_share": statistics.mean(r["mask_seconds"] / r["seconds"] for r in runs),
            "runs_seconds": [r["seconds"] for r in runs]}


def _parses(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except json.JSONDecodeError:
        return False


def _timed(engine, prompts: list[list[int]], params: list[SamplingParams]) -> dict[str, Any]:
    """One timed run; ``mask_seconds`` is the time the sampler spent in the grammar bitmask
    (fill + apply), measured inside the same run, so machine load affects it as it does
    the total."""
    engine.reset_prefix_cache()
    sampler = engine.core.executor.worker.sampler  # rank 0's, inside execute_model
    mask, mask_seconds = sampler.grammar_bitmask, 0.0

    def timed_mask(logits, grammars) -> None:
        nonlocal mask_seconds
        t = time.perf_counter()
        mask(logits, grammars)
        mask_seconds += time.perf_counter() - t

    sampler.grammar_bitmask = timed_mask
    start = time.perf_counter()
    try:
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            engine.add_request(engine.make_request(f"s{time.monotonic_ns()}-{i}",
                                                   {"prompt_token_ids": prompt}, p))
        outs = run_until_done(engine)
    finally:
        sampler.grammar_bitmask = mask
    seconds = time.perf_counter() - start
    comps = _in_order(outs, len(prompts))
    tokens = sum(len(c.token_ids) for c in comps)
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
            "mask_seconds": mask_seconds,
            "lengths": [len(c.token_ids) for c in comps], "texts": [c.text for c in comps]}


def _in_order(outs: dict, count: int) -> list:
    """Completions in submission order (request ids end with ``-<index>``)."""
    by_index = {int(rid.rsplit("-", 1)[1]): out.outputs[0] for rid, out in outs.items()}
    return [by_index[i] for i in range(count)]


def _compile_times(engine) -> dict[str, float]:
    start = time.perf_counter()
    cache = GrammarCompilerCache(engine.tokenizer, engine.input_processor.vocab_size, engine.input_processor.eos_token_ids)
    first = cache.compile(StructuredOutputsParams(json_object=True))  # builds the vocabulary
    vocabulary_s = time.perf_counter() - start
    del first
    cold, cached = [], []
    for schema in SCHEMAS:
        for into in (cold, cached):
            params = StructuredOutputsParams(json=schema)
            t = time.perf_counter()
            cache.compile(params)
            into.append(time.perf_counter() - t)
    return {"vocabulary_s": vocabulary_s, "cold_ms_median": statistics.median(cold) * 1e3,
            "cold_ms_max": max(cold) * 1e3, "cached_ms_median": statistics.median(cached) * 1e3}


def print_summary(results: dict[str, Any]) -> None:
    c, f, comp = results["constrained"], results["unconstrained"], results["compile"]
    print(f"{results['num_requests']} requests over {results['num_schemas']} schemas, "
          f"{c['tokens']} tokens each run; {results['valid_json']} outputs parse as JSON")
    print(f"json_schema: {c['tokens_per_s']:.1f} tok/s  none: {f['tokens_per_s']:.1f} tok/s  "
          f"overhead {results['overhead']:+.1%}; bitmask {c['mask_share']:.1%} of the "
          f"constrained run")
    print(f"compile: vocabulary {comp['vocabulary_s']:.2f} s once, schema cold "
          f"{comp['cold_ms_median']:.1f} ms median ({comp['cold_ms_max']:.1f} max), cached "
          f"{comp['cached_ms_median']:.2f} ms")


def plot(results: dict[str, Any], out_dir, name: str) -> None:
    fig, axes = new_figure(ncols=2)
    ax = axes[0][0]
    values = [results["unconstrained"]["tokens_per_s"], results["constrained"]["tokens_per_s"]]
    ax.bar(["none", "json_schema"], values, color=["tab:gray", "tab:blue"])
    ax.set_ylabel("generated tokens / s")
    ax.set_title(f"Same {results['num_requests']} requests, same tokens "
                 f"(overhead {results['overhead']:+.1%})")
    ax = axes[0][1]
    comp = results["compile"]
    ax.bar(["schema cold\n(median)", "schema cold\n(max)", "cached"],
           [comp["cold_ms_median"], comp["cold_ms_max"], comp["cached_ms_median"]])
    ax.set_ylabel("ms")
    ax.set_title(f"Grammar compile (vocabulary once: {comp['vocabulary_s']:.2f} s)")
    save_plot(fig, out_dir, name)


def readme_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    c, f, comp = result["constrained"], result["unconstrained"], result["compile"]
    return [
        ("setup", f"{result['num_requests']} greedy chat requests over {result['num_schemas']} "
                  f"JSON schemas, {result['dtype']}; unconstrained run with the same lengths"),
        ("throughput json_schema vs none", f"{c['tokens_per_s']:.1f} vs {f['tokens_per_s']:.1f} "
                                           f"tok/s ({result['overhead']:+.1%} time)"),
        ("time in the grammar bitmask (fill + apply), constrained runs",
         f"{c['mask_share']:.1%}"),
        ("outputs that parse as JSON", f"{result['valid_json']} / {result['num_requests']}"),
        ("compile: vocabulary (once per engine)", f"{comp['vocabulary_s']:.2f} s"),
        ("compile: schema cold median / max, cached",
         f"{comp['cold_ms_median']:.1f} / {comp['cold_ms_max']:.1f} ms, "
         f"{comp['cached_ms_median']:.2f} ms"),
    ]
