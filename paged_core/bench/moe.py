"""``bench moe``: decode step time of a mixture-of-experts model against its total and active experts.

Models: random-weight Qwen3-MoE-shaped checkpoints (the embedded tokenizer's vocabulary;
4 layers, hidden 512, 8 query / 4 KV heads of 64, experts 256 wide), built with
transformers and served through the engine in ``--dtype``. Grid: total experts
``--experts`` (default 8, 32, 128) at ``top_k`` 2, and ``top_k`` ``--top-k`` (1, 2, 4, 8)
at 32 experts; each with ``--batch`` (1 and 16) sequences of 32-token prompts (different texts) decoding
``--output-len`` tokens, greedy. Reported per case: the median time of the decode steps
(every sequence decoding), output tok/s, and the mean number of experts a layer ran per
step. Experts are computed grouped (``models/moe.py``: one GEMM pair per expert some token
chose), so at a fixed batch the step time follows the experts that run (``top_k`` and how
many tokens the batch holds), not the experts the model has.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from statistics import median
from typing import Any

from paged_core import SamplingParams

from .engine_driver import make_engine, submit
from .report import new_figure, save_plot
from .workload import BenchRequest, corpus_token_ids, embedded_tokenizer

NAME = "moe"
SHAPE = dict(num_hidden_layers=4, hidden_size=512, intermediate_size=1024,
             num_attention_heads=8, num_key_value_heads=4, head_dim=64, moe_intermediate_size=256,
             max_position_embeddings=2048, norm_topk_prob=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--experts", default="8,32,128", help="total experts (top_k 2)")
    parser.add_argument("--top-k", default="1,2,4,8", help="experts per token (32 experts)")
    parser.add_argument("--batch", default="1,16", help="sequences decoding together")
    parser.add_argument("--output-len", type=int, default=48)


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.quick:
        experts, top_ks, batches, output_len = [4, 8], [1, 2], [1, 4], 6
    else:
        experts, top_ks = _ints(args.experts), _ints(args.top_k)
        batches, output_len = _ints(args.batch), args.output_len
    cases = [(e, 2) for e in experts] + [(32 if not args.quick else 8, k) for k in top_ks]
    tokenizer = embedded_tokenizer()
    corpus = corpus_token_ids(tokenizer)
    prompts = [corpus[37 * i:37 * i + 32] for i in range(max(batches))]  # one text per sequence
    rows = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch:
        for num_experts, top_k in dict.fromkeys(cases):
            folder = _random_moe(tokenizer, scratch, num_experts, top_k, args.quick)
            engine = make_engine(args.dtype, model=folder, max_num_seqs=max(batches))
            for batch in batches:
                rows.append({"experts": num_experts, "top_k": top_k, "batch": batch,
                             **_decode(engine, prompts[:batch], output_len)})
            engine.shutdown()
    return {"dtype": args.dtype, "shape": SHAPE, "output_len": output_len, "rows": rows,
            "load_average_before": load_before, "load_average_after": os.getloadavg()}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def _random_moe(tokenizer, scratch: str, num_experts: int, top_k: int, quick: bool) -> str:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    shape = {**SHAPE, "hidden_size": 128, "moe_intermediate_size": 64} if quick else SHAPE
    folder = os.path.join(scratch, f"moe-{num_experts}x{top_k}")
    torch.manual_seed(0)
    config = Qwen3MoeConfig(vocab_size=len(tokenizer), num_experts=num_experts,
                            num_experts_per_tok=top_k, **shape)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _decode(engine, prompts: list[list[int]], output_len: int) -> dict[str, Any]:
    """Step one request per prompt to the end, timing each step. Every prompt prefills in
    the first step; the others are decode steps (all sequences end together)."""
    from paged_core.models.moe import SparseMoeBlock

    blocks = [m for m in engine.core.executor.runner.model.modules() if isinstance(m, SparseMoeBlock)]
    ran: list[int] = []  # the experts run, over every layer, in this step
    for block in blocks:
        block._expert = _counting(block._expert, ran)
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    batch = len(prompts)
    for i, prompt in enumerate(prompts):
        submit(engine, f"b{batch}-{i}", BenchRequest(prompt, output_len), params)
    steps, start = [], time.perf_counter()
    while engine.has_unfinished_requests():
        ran.clear()
        t = time.perf_counter()
        engine.step()
        steps.append((time.perf_counter() - t, len(ran) / len(blocks)))
    seconds = time.perf_counter() - start
    for block in blocks:
        del block._expert  # the class's own again
    decode = steps[1:]
    return {"decode_step_ms": median(t for t, _ in decode) * 1e3,
            "experts_run_per_layer": median(n for _, n in decode),
            "output_tok_s": batch * output_len / seconds, "decode_steps": len(decode)}


def _counting(run_expert, ran: list[int]):
    """``run_expert`` that also records each expert it runs in ``ran``."""
    def counted(expert, rows):
        ran.append(expert)
        return run_expert(expert, rows)
    return counted


def print_summary(results: dict[str, Any]) -> None:
    print(f"{'experts':>8}{'top_k':>6}{'batch':>6}{'experts run':>12}{'step ms':>9}{'tok/s':>8}")
    for r in results["rows"]:
        print(f"{r['experts']:>8}{r['top_k']:>6}{r['batch']:>6}{r['experts_run_per_layer']:>12.1f}"
              f"{r['decode_step_ms']:>9.2f}{r['output_tok_s']:>8.1f}")


def plot(results: dict[str, Any], out_dir, name: str) -> None:
    """Step time against total experts and against top_k, per batch; and against the experts
    that actually ran (every case): the one that predicts it."""
    fig, axes = new_figure(ncols=3, width=4.6)
    rows = results["rows"]
    for batch in sorted({r["batch"] for r in rows}):
        by_experts = sorted((r["experts"], r["decode_step_ms"]) for r in rows
                            if r["batch"] == batch and r["top_k"] == 2)
        axes[0][0].plot(*zip(*by_experts), "o-", label=f"batch {batch}")
        top_e = max(r["experts"] for r in rows if r["top_k"] != 2) if any(
            r["top_k"] != 2 for r in rows) else None
        by_k = sorted((r["top_k"], r["decode_step_ms"]) for r in rows
                      if r["batch"] == batch and r["experts"] == top_e)
        if by_k:
            axes[0][1].plot(*zip(*by_k), "s-", label=f"batch {batch}")
        ran = sorted((r["experts_run_per_layer"], r["decode_step_ms"]) for r in rows
                     if r["batch"] == batch)
        axes[0][2].plot(*zip(*ran), "^", label=f"batch {batch}")
    axes[0][0].set(xscale="log", xlabel="total experts (top_k 2)", ylabel="decode step ms",
                   title="step time vs total experts")
    axes[0][2].set(xlabel="experts run per layer and step", ylabel="decode step ms",
                   title="step time vs experts that ran")
    axes[0][1].set(xlabel="top_k (experts per token)", ylabel="decode step ms",
                   title="step time vs active experts")
    for ax in axes[0]:
        ax.set_ylim(0, None)
        ax.legend(fontsize=8)
    fig.suptitle(f"random Qwen3-MoE-shaped models, {results['dtype']}", fontsize=9)
    save_plot(fig, out_dir, name)


def readme_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    return [(f"{r['experts']} experts, top_k {r['top_k']}, batch {r['batch']}",
             f"{r['decode_step_ms']:.2f} ms per decode step, {r['experts_run_per_layer']:.1f} "
             f"experts run per layer, {r['output_tok_s']:.1f} tok/s") for r in result["rows"]]
