"""``bench quality``: perplexity of the served weights and KV cache formats, next to bfloat16.

Rows (each scored with every ``--kv-cache-dtypes`` value): the embedded model dense in
bfloat16 and float32, its GGUF Q4_1 projections served 4-bit (``quantization="gguf"``), and
each ``--model`` folder (e.g. a compressed-tensors W4A16 / W8A8 export of the same model),
quantized ones computing in ``--dtype``. Every row reports its perplexity and its ratio to
the bfloat16 dense row with the ``auto`` KV cache (the baseline).

Text: ``quality_text.txt`` (shipped in the package; the tests' prompts come from it too),
tokenized by each row's tokenizer; ratios compare rows that share one (the same model).

How the perplexity is computed: vLLM users get it from ``SamplingParams(prompt_logprobs=0)``;
this engine has no prompt logprobs yet, so the text is teacher-forced through the engine's
own ``ModelRunner`` (the served weights, kernels and KV cache): ``--chunk`` tokens per step,
each step attending to the earlier ones through the KV cache (as chunked prefill does, so a
quantized cache's rounding counts), with the float32 logits of every fed position
(``pack_batch``'s draft-token layout asks for them all). Perplexity is
``exp(-mean log p(t_i | t_<i))`` over every token but the first. The engine is idle and has
prefix caching off while it scores, so the blocks it writes are free ones. The run is small
already (one short text, a few engines): ``--quick`` changes nothing.
"""
from __future__ import annotations

import argparse
import math
import os
from typing import Any

import torch

from .quality_text import quality_text
from .report import new_figure, save_plot

NAME = "quality"
BASELINE = "bf16 dense"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", action="append", default=[], metavar="FOLDER",
                        help="a quantized folder of the embedded model (compressed-tensors, "
                             "...) to score as one more row; repeatable")
    parser.add_argument("--kv-cache-dtypes", default="auto",
                        help="comma-separated kv_cache_dtype values to score every row with "
                             "(e.g. auto,int8,fp8)")
    parser.add_argument("--chunk", type=int, default=16, help="text tokens per engine step")


def weight_rows(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Row name -> ``LLM`` arguments of each weight format."""
    rows = {BASELINE: {"dtype": "bfloat16"}, "float32 dense": {"dtype": "float32"},
            "gguf Q4_1": {"dtype": args.dtype, "quantization": "gguf"}}
    for folder in args.model:
        rows[os.path.basename(os.path.normpath(folder))] = {"model": folder, "dtype": args.dtype}
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    listed = [d.strip() for d in args.kv_cache_dtypes.split(",") if d.strip()]
    kv_dtypes = ["auto"] + [d for d in dict.fromkeys(listed) if d != "auto"]  # auto: the baseline's
    rows = []
    for name, engine_args in weight_rows(args).items():
        for kv in kv_dtypes:
            nll, tokens = _score(engine_args, kv, args.chunk)
            rows.append({"name": name, **engine_args, "kv_cache_dtype": kv,
                         "tokens_scored": tokens, "nll": nll, "perplexity": math.exp(nll)})
    base = next(r for r in rows if r["name"] == BASELINE and r["kv_cache_dtype"] == "auto")
    for row in rows:
        row["ratio_to_bf16"] = row["perplexity"] / base["perplexity"]
    return {"text": "paged_core/bench/quality_text.txt", "chunk": args.chunk,
            "baseline": f"{BASELINE}, kv_cache_dtype auto", "method": _METHOD, "rows": rows}


_METHOD = ("teacher-forced through the engine's ModelRunner, --chunk tokens per step through "
           "the KV cache; perplexity = exp(mean negative log-likelihood of every token but the "
           "first), from float32 logits")


def _score(engine_args: dict[str, Any], kv_cache_dtype: str, chunk: int) -> tuple[float, int]:
    """(mean negative log-likelihood, tokens scored) of the text under one engine."""
    from paged_core import LLM

    kv = {} if kv_cache_dtype == "auto" else {"kv_cache_dtype": kv_cache_dtype}
    llm = LLM(**engine_args, **kv, enable_prefix_caching=False, num_kv_blocks=64)
    try:
        ids = llm.get_tokenizer().encode(quality_text())
        logprobs = text_logprobs(llm, ids, chunk)
    finally:
        llm.shutdown()
    return -float(logprobs.mean()), len(logprobs)


def text_logprobs(llm, ids: list[int], chunk: int) -> torch.Tensor:
    """``log p(ids[i] | ids[:i])`` for ``i >= 1``, float32, from an idle in-process engine."""
    from ..executor.packed_batch import StepInput, pack_batch

    runner = llm.engine.core.executor.runner
    blocks = list(range(-(-len(ids) // runner.block_size)))
    if len(blocks) > llm.engine.core.executor.num_blocks or llm.engine.has_unfinished_requests():
        raise ValueError("scoring needs an idle engine with room for the whole text")
    out = []
    for start in range(0, len(ids) - 1, chunk):
        n = min(chunk, len(ids) - 1 - start)
        step = StepInput(ids, start, n, blocks, needs_logits=True, num_spec_tokens=n - 1)
        logits = runner.execute(pack_batch([step], runner.block_size), []).cpu().float()
        targets = torch.tensor(ids[start + 1:start + n + 1])
        out.append(torch.log_softmax(logits, -1)[torch.arange(n), targets])
    return torch.cat(out)


def print_summary(results: dict[str, Any]) -> None:
    print(f"{'weights':<28}{'kv cache':>10}{'perplexity':>12}{'vs bf16':>10}")
    for r in results["rows"]:
        print(f"{r['name']:<28}{r['kv_cache_dtype']:>10}{r['perplexity']:>12.3f}"
              f"{r['ratio_to_bf16']:>10.3f}")


def _label(row: dict[str, Any]) -> str:
    kv = row["kv_cache_dtype"]
    return row["name"] if kv == "auto" else f"{row['name']}, kv {kv}"


def plot(results: dict[str, Any], out_dir, name: str) -> None:
    fig, axes = new_figure(width=7.0, height=1.2 + 0.45 * len(results["rows"]))
    ax, rows = axes[0][0], results["rows"]
    colors = ["tab:gray" if r["name"] in (BASELINE, "float32 dense") else "tab:blue" for r in rows]
    bars = ax.barh([_label(r) for r in rows], [r["perplexity"] for r in rows], color=colors)
    for bar, row in zip(bars, rows):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2,
                f" {row['perplexity']:.2f} ({row['ratio_to_bf16']:.3f}x)", va="center", fontsize=8)
    ax.axvline(rows[0]["perplexity"] if rows else 0, color="black", lw=0.8, ls="--")
    ax.invert_yaxis()
    ax.set_xlabel("perplexity on quality_text.txt (lower is better; ratio to bf16 dense)")
    ax.margins(x=0.25)
    fig.suptitle("Perplexity per weight format and KV cache dtype")
    save_plot(fig, out_dir, name)


def readme_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    return [(f"perplexity, {_label(r)}", f"{r['perplexity']:.3f} ({r['ratio_to_bf16']:.3f}x bf16)")
            for r in result["rows"]]
