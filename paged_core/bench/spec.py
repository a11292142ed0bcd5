"""``bench spec``: speculative decoding on an input-grounded workload (ITL, tok/s, acceptance).

Workload: chat requests to the embedded SmolLM2-135M-Instruct asking it to
repeat a passage of English text (windows of the benchmark corpus), so the
output copies long spans of the prompt: the case prompt lookup is made for.
Systems: plain decoding; n-gram speculation (``{"method": "ngram",
"num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}``);
and a draft model with random weights (2 layers, 64 wide, the target's
tokenizer), which measures the mechanics only: its drafts are almost never
accepted, so it shows the overhead of drafting and verifying, not a gain.
Each concurrency ``c`` runs ``max(c, 3)`` requests (``--quick``: one) with at
most ``c`` in flight (``max_num_seqs=c``), greedy, exactly ``output_len`` tokens each. The chat
prompt already holds the answer's first 8 tokens (the 135M model otherwise
often describes the text instead of repeating it).
Reported per system and ``c``: output tok/s, mean inter-token latency, draft
acceptance rate and mean acceptance length, speedup over plain decoding.
"""
from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from typing import Any

from paged_core import LLMEngine, SamplingParams
from paged_core.frontend.chat_prompt import chat_prompt_token_ids

from .engine_driver import make_engine, run_until_done, submit
from .report import new_figure, percentiles, save_plot
from .workload import WARMUP, BenchRequest, corpus_token_ids, embedded_tokenizer, text_window

NAME = "spec"
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
         "prompt_lookup_min": 2}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", default="1,4,16", help="requests in flight")
    parser.add_argument("--passage-len", type=int, default=160, help="tokens of text to repeat")
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--systems", default="plain,ngram,draft",
                        help="any of plain, ngram, draft (plain is always run: the baseline)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.quick:
        concurrency, passage_len, output_len, systems = [1], 48, 12, ["plain", "ngram"]
    else:
        concurrency = [int(c) for c in args.concurrency.split(",")]
        passage_len, output_len = args.passage_len, args.output_len
        systems = ["plain"] + [s for s in args.systems.split(",") if s in ("ngram", "draft")]
    tokenizer = embedded_tokenizer()
    corpus = corpus_token_ids(tokenizer)
    rng = random.Random(args.seed)
    per_concurrency = {c: 1 if args.quick else max(c, 3) for c in concurrency}
    requests = [BenchRequest(_repeat_prompt(tokenizer, text_window(corpus, rng, passage_len)),
                             output_len) for _ in range(max(per_concurrency.values()))]
    rows = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch:
        for system in systems:
            spec = (None if system == "plain" else NGRAM if system == "ngram" else
                    {"model": _random_draft(tokenizer, scratch), "num_speculative_tokens": 4})
            for c in concurrency:
                engine = make_engine(args.dtype, max_num_seqs=c, speculative_config=spec)
                _run_requests(engine, WARMUP, "warmup")
                rows.append({"system": system, "concurrency": c,
                             **_measure(engine, requests[:per_concurrency[c]])})
                engine.shutdown()
    base = {r["concurrency"]: r for r in rows if r["system"] == "plain"}
    for r in rows:
        plain = base[r["concurrency"]]
        r["speedup_tok_s"] = r["output_tok_s"] / plain["output_tok_s"]
        r["same_tokens_as_plain"] = r.pop("outputs") == plain["outputs"] if r is not plain else True
    for r in base.values():
        r.pop("outputs")
    return {"dtype": args.dtype, "model": "SmolLM2-135M-Instruct (embedded)",
            "passage_len": passage_len, "output_len": output_len,
            "mean_prompt_len": sum(r.prompt_len for r in requests) / len(requests),
            "ngram_config": NGRAM, "rows": rows,
            "load_average_before": load_before, "load_average_after": os.getloadavg(),
            "notes": ["verifying k drafts runs k + 1 rows through every linear: free where a "
                      "decode step is memory-bound (GPU, idle CPU), not on a busy CPU where "
                      "GEMM time grows with the rows (see load_average_*)",
                      "draft = random-weight 2-layer Llama with the target's tokenizer: it "
                      "measures the cost of drafting + verifying (acceptance ~0), not a gain"]}


def _repeat_prompt(tokenizer, passage: list[int], answer_start: int = 8) -> list[int]:
    """The chat prompt, with the answer's first ``answer_start`` tokens already written (the
    135M model otherwise tends to describe the text instead of repeating it)."""
    text = tokenizer.decode(passage)
    messages = [{"role": "user", "content": f"Repeat the following text exactly, word for "
                                            f"word:\n\n{text}"}]
    return chat_prompt_token_ids(tokenizer, messages) + passage[:answer_start]


def _random_draft(tokenizer, scratch: str) -> str:
    """A random-weight 2-layer Llama with the target's tokenizer, saved under ``scratch``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = os.path.join(scratch, "random-draft")
    if not os.path.isdir(folder):
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=2048, tie_word_embeddings=True)
        LlamaForCausalLM(config).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return folder


def _run_requests(engine: LLMEngine, requests: list[BenchRequest], prefix: str):
    for i, request in enumerate(requests):
        params = SamplingParams(temperature=0, max_tokens=request.output_len, ignore_eos=True)
        submit(engine, f"{prefix}-{i}", request, params)
    return run_until_done(engine)


def _measure(engine: LLMEngine, requests: list[BenchRequest]) -> dict[str, Any]:
    before = engine.stats()
    start = time.perf_counter()
    outputs = _run_requests(engine, requests, "r")
    seconds = time.perf_counter() - start
    after = engine.stats()
    itl = []
    for out in outputs.values():
        m, n = out.metrics, len(out.outputs[0].token_ids)
        itl.append((m.finished_time - m.first_token_time) / max(n - 1, 1) * 1000)
    def delta(key: str) -> float:
        return after.get(key, 0) - before.get(key, 0)

    drafted = delta("spec_decode_num_draft_tokens")
    accepted = delta("spec_decode_num_accepted_tokens")
    drafts = delta("spec_decode_num_drafts")
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs.values())
    return {"num_requests": len(requests), "output_tokens": tokens, "seconds": seconds,
            "output_tok_s": tokens / seconds, "itl_ms": percentiles(itl),
            "draft_tokens": drafted, "accepted_tokens": accepted,
            "acceptance_rate": accepted / drafted if drafted else None,
            "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
            "outputs": [outputs[f"r-{i}"].outputs[0].token_ids for i in range(len(requests))]}


def print_summary(results: dict[str, Any]) -> None:
    print(f"repeat-the-text prompts (~{results['mean_prompt_len']:.0f} tokens), "
          f"{results['output_len']} output tokens, {results['dtype']}")
    print(f"{'system':>7}{'c':>4}{'tok/s':>9}{'ITL ms':>9}{'speedup':>9}{'accept':>8}"
          f"{'mean len':>9}{'same':>6}")
    for r in results["rows"]:
        rate = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.0%}"
        length = ("-" if r["mean_acceptance_length"] is None
                  else f"{r['mean_acceptance_length']:.2f}")
        print(f"{r['system']:>7}{r['concurrency']:>4}{r['output_tok_s']:>9.1f}"
              f"{r['itl_ms']['mean']:>9.1f}{r['speedup_tok_s']:>8.2f}x{rate:>8}{length:>9}"
              f"{str(r['same_tokens_as_plain']):>6}")


def plot(results: dict[str, Any], out_dir, name: str) -> None:
    fig, axes = new_figure(ncols=2)
    systems = list(dict.fromkeys(r["system"] for r in results["rows"]))
    for system in systems:
        rows = [r for r in results["rows"] if r["system"] == system]
        cs = [r["concurrency"] for r in rows]
        axes[0][0].plot(cs, [r["output_tok_s"] for r in rows], marker="o", label=system)
        axes[0][1].plot(cs, [r["itl_ms"]["mean"] for r in rows], marker="o", label=system)
        for r in rows:
            if system == "ngram":
                axes[0][0].annotate(f"{r['speedup_tok_s']:.2f}x, {r['acceptance_rate']:.0%} acc.",
                                    (r["concurrency"], r["output_tok_s"]),
                                    textcoords="offset points", xytext=(0, 6), ha="center")
    labels = ("output tokens/s", "mean inter-token latency (ms)")
    for ax, label in zip(axes[0], labels):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel(label)
        ax.legend()
    axes[0][0].set_title("Speculative decoding, repeat-the-text workload")
    save_plot(fig, out_dir, name)


def readme_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [("setup", f"repeat-the-text chat prompts (~{result['mean_prompt_len']:.0f} tokens), "
                      f"{result['output_len']} output tokens, greedy, {result['dtype']}")]
    for r in result["rows"]:
        if r["system"] == "plain":
            rows.append((f"plain c={r['concurrency']}",
                         f"{r['output_tok_s']:.1f} tok/s, ITL {r['itl_ms']['mean']:.1f} ms"))
            continue
        rows.append((f"{r['system']} c={r['concurrency']}",
                     f"{r['output_tok_s']:.1f} tok/s ({r['speedup_tok_s']:.2f}x), ITL "
                     f"{r['itl_ms']['mean']:.1f} ms, acceptance {r['acceptance_rate'] or 0:.0%}, "
                     f"mean acceptance length {r['mean_acceptance_length'] or 1:.2f}"))
    return rows
