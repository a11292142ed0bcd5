"""``bench tp``: tensor parallelism per rank: weight and KV bytes, step time, communication share.

For each model and ``tensor_parallel_size`` in ``--sizes`` (a size the model's
heads do not split into is reported with the engine's own refusal):

- memory per rank: weights and KV cache of every rank (rank 0 read from the
  running engine; every rank also rebuilt in this process from its
  ``ShardPlan`` slice, see ``tp_probe.rank_memory``), at a fixed KV cache of
  ``--kv-blocks`` blocks;
- decode step: ``--batch`` sequences of ``--context`` prompt tokens are
  prefilled, then ``--steps`` decode steps (after ``--warmup``) are timed one
  ``LLMEngine.step()`` each; median;
- prefill step: one ``--context``-token prompt per step (prefix caching off),
  timed the same way;
- communication: wall time rank 0 spends inside the collectives (all-reduce,
  logits gather, the step broadcast), measured by wrapping them in this
  process (``tp_probe.CollectiveTimer``); the rest of the step is "compute"
  (rank 0's shard, scheduling, sampling).

Models: the embedded SmolLM2-135M (9 heads, 3 KV heads: sizes 1 and 3 only) and
a random-weight Llama with 12 heads / 6 KV heads (sizes 1, 2, 3), built in a
temporary folder with the embedded tokenizer. On a CPU every rank shares the
same few cores and talks gloo over loopback: TP cannot be faster there; what
it buys is memory per rank (~1/N of the weights and KV cache).
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
from typing import Any

import torch

from ..cpu.isa import packed_linear_dtype
from ..config import EngineConfig
from ..engine.llm_engine import LLMEngine
from ..models.registry import model_spec
from ..models.model_loader import load_hf_config, resolve_model_folder
from ..models.sharding import allowed_tensor_parallel_sizes
from ..executor.rank_worker import threads_per_rank
from .engine_driver import submit
from .report import command_line, cpu_model, new_figure, save_plot
from .model_bytes import kv_cache_bytes, model_bytes
from .tp_probe import CollectiveTimer, rank_memory
from .workload import BenchRequest, corpus_token_ids, embedded_tokenizer, text_window

NAME = "tp"
EMBEDDED = "SmolLM2-135M (embedded)"
TINY = "random Llama 12 heads / 6 KV heads"
SHORT = {EMBEDDED: "SmolLM2", TINY: "tiny Llama"}
CAVEAT = ("TP cannot be faster on a few-core CPU: every rank shares the same cores (here each "
          "rank gets cores // N torch threads, at least 1) and the ranks talk gloo over loopback; "
          "what this shows is memory per rank (~1/N of the weights and KV cache) and the share "
          "of each step rank 0 spends in collectives. Step times compare thread layouts on a "
          "machine that may be running other work (see load_average_before), not a speed-up")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default="1,2,3", help="tensor_parallel_size values to try")
    parser.add_argument("--batch", type=int, default=8, help="sequences per decode step")
    parser.add_argument("--context", type=int, default=256,
                        help="prompt tokens per sequence (decode context, prefill length)")
    parser.add_argument("--steps", type=int, default=12, help="timed steps of each kind")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before them")
    parser.add_argument("--kv-blocks", type=int, default=256, help="KV cache blocks per rank")


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """Sizes per model and workload; ``--quick`` runs the tiny model at TP 1 and 2 and only
    asks the engine to refuse TP 2 for the embedded model (no 135M load: a fast smoke test)."""
    if args.quick:
        return {"sizes": {EMBEDDED: [2], TINY: [1, 2]}, "batch": 2, "context": 32, "steps": 3,
                "warmup": 1, "kv_blocks": 16, "tiny_layers": 2}
    sizes = [int(s) for s in args.sizes.split(",")]
    return {"sizes": {EMBEDDED: sizes, TINY: sizes}, "batch": args.batch,
            "context": args.context, "steps": args.steps, "warmup": args.warmup,
            "kv_blocks": args.kv_blocks, "tiny_layers": 6}


def build_random_llama(folder: str, num_layers: int) -> str:
    """A seeded random-weight Llama (hidden 384, 12 heads, 6 KV heads, MLP 1152) with the
    embedded tokenizer, saved as a Hugging Face folder; every size in 1, 2, 3, 4, 6 splits it."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    tokenizer = embedded_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=384, intermediate_size=1152,
                         num_hidden_layers=num_layers, num_attention_heads=12,
                         num_key_value_heads=6, max_position_embeddings=2048,
                         tie_word_embeddings=False, initializer_range=0.05)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def run(args: argparse.Namespace) -> dict[str, Any]:
    s = _settings(args)
    rng = random.Random(args.seed)
    corpus = corpus_token_ids(embedded_tokenizer())
    prompts = [text_window(corpus, rng, s["context"])
               for _ in range(s["batch"] + s["warmup"] + s["steps"])]
    models = {}
    with tempfile.TemporaryDirectory(prefix="paged-core-bench-tp-") as tmp:
        folders = {EMBEDDED: None, TINY: build_random_llama(tmp, s["tiny_layers"])}
        for label, folder in folders.items():
            models[label] = _run_model(folder, s["sizes"][label], args, s, prompts)
    return {"dtype": args.dtype, "native_bf16_matmul": _native_bf16(),
            "machine_summary": f"{cpu_model()}, {os.cpu_count()} cores",
            "run_command": command_line(getattr(args, "argv", ["tp"])),
            "load_average_before": os.getloadavg()[0],
            "settings": {k: v for k, v in s.items() if k != "sizes"}, "models": models,
            "method": __doc__.split("\n\n", 1)[1].strip(), "notes": [CAVEAT]}


def _run_model(folder: str | None, sizes: list[int], args: argparse.Namespace,
               s: dict[str, Any], prompts: list[list[int]]) -> dict[str, Any]:
    spec = model_spec(load_hf_config(resolve_model_folder(folder)))
    entry = {"heads": spec.num_heads, "kv_heads": spec.num_kv_heads,
             "mlp_width": spec.intermediate_size, "layers": spec.num_layers,
             "allowed_sizes": allowed_tensor_parallel_sizes(spec, limit=16), "sizes": {}}
    for size in sizes:
        entry["sizes"][str(size)] = _run_size(folder, size, args, s, prompts)
    return entry


def _native_bf16() -> bool:
    return packed_linear_dtype(torch.device("cpu"), torch.bfloat16) == torch.bfloat16


def _run_size(folder: str | None, size: int, args: argparse.Namespace, s: dict[str, Any],
              prompts: list[list[int]]) -> dict[str, Any]:
    config = EngineConfig(model=folder, dtype=args.dtype, tensor_parallel_size=size,
                          num_kv_blocks=s["kv_blocks"], enable_prefix_caching=False,
                          max_model_len=2048, max_num_batched_tokens=max(2048, s["batch"] * s["context"]))
    try:
        engine = LLMEngine(config)
    except ValueError as exc:  # the engine refuses a size the model's heads do not split into
        return {"refused": str(exc)}
    timer = CollectiveTimer()
    try:
        with timer.installed():
            decode = _decode_steps(engine, timer, s, prompts[:s["batch"]])
            prefill = _prefill_steps(engine, timer, s, prompts[s["batch"]:])
        rank0 = {"weight_bytes": model_bytes(engine.core.executor.runner.model),
                 "kv_cache_bytes": kv_cache_bytes(engine.core.executor.runner.kv_caches)}
    finally:
        engine.shutdown()
        torch.set_num_threads(args.threads)  # the driver executor lowered it to its share
    ranks = rank_memory(resolve_model_folder(folder), engine.core.model.dtype, size, config.block_size,
                        s["kv_blocks"], engine.max_model_len)
    return {"ranks": size, "threads_per_rank": args.threads if size == 1 else threads_per_rank(size),
            "rank0_engine": rank0, "per_rank": ranks, "decode": decode, "prefill": prefill}


def _decode_steps(engine: LLMEngine, timer: CollectiveTimer, s: dict[str, Any],
                  prompts: list[list[int]]) -> dict[str, Any]:
    """Prefill ``batch`` sequences, then time decode steps of all of them at once."""
    out_len = 1 + s["warmup"] + s["steps"]
    for i, prompt in enumerate(prompts):
        submit(engine, f"decode-{i}", BenchRequest(prompt, out_len))
    while any(engine.core.requests[r].sequences[0].num_output_tokens == 0 for r in engine.core.requests):
        engine.step()
    samples = []
    for i in range(s["warmup"] + s["steps"]):
        wall, comm, outputs = timer.time_step(engine.step)
        assert len(outputs) == len(prompts), "every sequence decodes in every timed step"
        if i >= s["warmup"]:
            samples.append((wall, comm))
    assert not engine.has_unfinished_requests()
    return _summary(samples, context=len(prompts[0]))


def _prefill_steps(engine: LLMEngine, timer: CollectiveTimer, s: dict[str, Any],
                   prompts: list[list[int]]) -> dict[str, Any]:
    """One whole prompt per step (prefix caching is off: every token is computed)."""
    samples = []
    for i, prompt in enumerate(prompts):
        submit(engine, f"prefill-{i}", BenchRequest(prompt, 1))
        wall, comm, _ = timer.time_step(engine.step)
        assert not engine.has_unfinished_requests()
        if i >= s["warmup"]:
            samples.append((wall, comm))
    return _summary(samples, context=len(prompts[0]))


def _summary(samples: list[tuple[float, float]], context: int) -> dict[str, Any]:
    walls = [w * 1000 for w, _ in samples]
    comms = [c * 1000 for _, c in samples]
    return {"tokens_of_context": context, "step_ms": walls, "comm_ms": comms,
            "step_ms_median": statistics.median(walls),
            "comm_ms_median": statistics.median(comms),
            "compute_ms_median": statistics.median(w - c for w, c in zip(walls, comms)),
            "comm_share": sum(comms) / sum(walls)}


def _mib(n: int) -> float:
    return n / 2**20


def _ran(model: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {size: r for size, r in model["sizes"].items() if "refused" not in r}


def print_summary(results: dict[str, Any]) -> None:
    print(f"{results['machine_summary']}; {results['dtype']}")
    print(f"{'model':<36}{'TP':>3}{'weights/rank MiB':>18}{'KV/rank MiB':>13}"
          f"{'decode ms':>11}{'comm':>7}{'prefill ms':>12}{'comm':>7}")
    for label, model in results["models"].items():
        for size, r in model["sizes"].items():
            if "refused" in r:
                print(f"{label:<36}{size:>3}  refused: {r['refused']}")
                continue
            print(f"{label:<36}{size:>3}{_mib(r['per_rank'][0]['weight_bytes']):>18.1f}"
                  f"{_mib(r['per_rank'][0]['kv_cache_bytes']):>13.1f}"
                  f"{r['decode']['step_ms_median']:>11.1f}{r['decode']['comm_share']:>7.0%}"
                  f"{r['prefill']['step_ms_median']:>12.1f}{r['prefill']['comm_share']:>7.0%}")
    print(f"note: {CAVEAT}")


def plot(results: dict[str, Any], out_dir, name: str) -> None:
    labels = list(results["models"])
    fig, axes = new_figure(ncols=3, width=5.0, height=4.6)
    drawn = 0
    for label in labels:
        ran = _ran(results["models"][label])
        sizes = list(ran)
        if not sizes:
            continue
        weights = [_mib(ran[k]["per_rank"][0]["weight_bytes"]) for k in sizes]
        kv = [_mib(ran[k]["per_rank"][0]["kv_cache_bytes"]) for k in sizes]
        ax = axes[0][0]
        xs = [j + 4 * drawn for j in range(len(sizes))]
        ax.bar(xs, weights, color="tab:blue", label=None if drawn else "weights")
        ax.bar(xs, kv, bottom=weights, color="tab:orange", label=None if drawn else "KV cache")
        drawn += 1
        for x, k in zip(xs, sizes):
            ax.annotate(f"TP {k}", (x, 0), ha="center", va="top", xytext=(0, -2),
                        textcoords="offset points", fontsize=8)
        ax.text(sum(xs) / len(xs), max(w + v for w, v in zip(weights, kv)) * 1.02,
                SHORT.get(label, label), ha="center", fontsize=8)
    axes[0][0].set_xticks([])
    axes[0][0].set_ylabel("MiB per rank")
    axes[0][0].set_title("memory per rank")
    axes[0][0].legend(fontsize=8)
    for ax, kind in zip(axes[0][1:], ("decode", "prefill")):
        _time_bars(ax, results, kind)
    refused = [f"{SHORT.get(label, label)} TP {k} refused" for label in labels
               for k, r in results["models"][label]["sizes"].items() if "refused" in r]
    fig.suptitle(f"Tensor parallelism on {results['machine_summary']} ({results['dtype']})\n"
                 f"{results['run_command']}\n"
                 f"all ranks share these cores and talk gloo over loopback: TP cannot be faster "
                 f"here; it shows memory per rank and the communication share"
                 + (f"\n({'; '.join(refused)}: heads do not split)" if refused else ""),
                 fontsize=9)
    save_plot(fig, out_dir, name)


def _time_bars(ax, results: dict[str, Any], kind: str) -> None:
    s = results["settings"]
    names, compute, comm = [], [], []
    for label, model in results["models"].items():
        for size, r in _ran(model).items():
            names.append(f"{SHORT.get(label, label)}\nTP {size}")
            compute.append(r[kind]["compute_ms_median"])
            comm.append(r[kind]["comm_ms_median"])
    xs = range(len(names))
    ax.bar(xs, compute, color="tab:green", label="compute + schedule + sample (rank 0)")
    ax.bar(xs, comm, bottom=compute, color="tab:red", label="inside collectives (rank 0)")
    ax.set_xticks(list(xs), names, fontsize=7)
    ax.set_ylabel("ms per step (median)")
    what = (f"decode, {s['batch']} seqs at ~{s['context']} tokens" if kind == "decode"
            else f"prefill, one {s['context']}-token prompt")
    ax.set_title(what)
    ax.legend(fontsize=7)


def readme_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    s = result["settings"]
    rows = [("setup", f"{result['dtype']}, KV cache {s['kv_blocks']} blocks per rank, decode "
                      f"{s['batch']} seqs at ~{s['context']} tokens, prefill {s['context']} "
                      f"tokens, median of {s['steps']} steps")]
    for label, model in result["models"].items():
        for size, r in model["sizes"].items():
            key = f"{label}, TP {size}"
            if "refused" in r:
                rows.append((key, f"refused: {r['refused']}"))
                continue
            rank = r["per_rank"][0]
            rows.append((key, (
                f"{_mib(rank['weight_bytes']):.1f} MiB weights + {_mib(rank['kv_cache_bytes']):.1f} "
                f"MiB KV per rank; decode {r['decode']['step_ms_median']:.1f} ms "
                f"({r['decode']['comm_share']:.0%} in collectives), prefill "
                f"{r['prefill']['step_ms_median']:.1f} ms ({r['prefill']['comm_share']:.0%})")))
    return rows
