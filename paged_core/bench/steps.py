"""``bench steps``: where an offline step's time goes (schedule, prepare, forward, logits, sample, update), by batch size.

The workload of ``bench throughput`` (``--workload``, the same sizes and seed; greedy,
exact output lengths) runs through one ``LLMEngine`` twice, as ``LLM.generate`` would
run it: once to warm up (oneDNN builds a kernel for each row count the first time it
sees one) and once timed, every step split into phases by ``PhaseTimer``
(``step_phases.py`` says what each phase covers). Steps are grouped by kind
(``decode``: every sequence decodes one token; ``mixed``: prompt chunks too) and by
how many sequences they carry (1, 2, 3-4, 5-8, ...); each group reports its mean
milliseconds per phase. The totals say which phase to make cheaper, the groups at
which batch sizes. ``--quantized KIND`` serves the embedded model's weights as one of
``bench throughput``'s quantized systems (``quantized_models.QUANTIZED_KINDS``: its own Q4_1
GGUF, compressed-tensors W4A16 / W8A16 / W8A8, ...) and ``--max-num-seqs N`` caps the
sequences a step carries, so a quantized lone-user or 8-sequence step can be taken apart
beside a bfloat16 one.

On the CPU each group is also set against memory: its steps' mean bytes to read (the
weights a decode step reads whole, ``model_bytes.step_weight_bytes``, plus the KV bytes
of every token of context its sequences hold) over the memory bandwidth measured in the
same run (the best ``torch.sum`` rate of ``machine_rates.memory_bandwidth`` before and
after the timed pass) is ``bound_ms``, the least time such a step can take;
``over_bound`` = ``mean_ms / bound_ms`` (decode steps of a few sequences are bound by
memory, so it says how far from the machine's limit they run; steps with prompt chunks
are bound by arithmetic, so theirs is only a lower bound).
"""
from __future__ import annotations

import argparse
from typing import Any

from ..executor.model_runner import kv_cache_bytes_per_block
from .engine_driver import make_engine, run_until_done, submit
from .machine_rates import PROBE_BYTES, PROBE_PASSES, memory_bandwidth
from .model_bytes import step_weight_bytes
from .quantized_models import QUANTIZED_KINDS, quantized_engine_args
from .report import new_figure, save_plot
from .step_phases import PHASES, PhaseTimer, StepRecord
from .throughput import KV_CACHE_MEMORY, add_workload_arguments, workload_spec
from .workload import embedded_tokenizer, sharegpt_like, summarize

NAME = "steps"
COLORS = dict(zip(PHASES, ("tab:purple", "tab:orange", "tab:olive", "tab:blue", "tab:cyan",
                           "tab:green", "tab:red", "tab:gray"), strict=True))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_workload_arguments(parser, default="long-tail")
    parser.add_argument("--quantized", choices=QUANTIZED_KINDS, default=None, metavar="KIND",
                        help="serve the embedded model quantized as KIND (one of "
                             f"{', '.join(QUANTIZED_KINDS)}) instead of at --dtype")
    parser.add_argument("--max-num-seqs", type=int, default=None,
                        help="at most this many sequences a step (e.g. 8)")
    parser.add_argument("--name", default=NAME, help="result file name (without extension)")


def size_group(num_seqs: int) -> str:
    """``1``, ``2``, ``3-4``, ``5-8``, ...: powers of two, each group ending at one."""
    if num_seqs <= 2:
        return str(num_seqs)
    top = 1 << (num_seqs - 1).bit_length()
    return f"{top // 2 + 1}-{top}"


def run(args: argparse.Namespace) -> dict[str, Any]:
    requests = sharegpt_like(workload_spec(args), embedded_tokenizer())
    engine_args = quantized_engine_args(args.quantized) if args.quantized else {}
    if args.max_num_seqs:
        engine_args["max_num_seqs"] = args.max_num_seqs
    engine = make_engine(args.dtype, kv_cache_memory=KV_CACHE_MEMORY, **engine_args)
    runner = engine.core.executor.runner
    layers = ("one C++ call (attention counted in forward)"
              if runner.model.decoder_stack is not None else "Python")
    on_cpu = runner.device.type == "cpu"
    memory = step_memory(runner) if on_cpu else None
    try:
        _submit_all(engine, requests, "warmup")
        run_until_done(engine)
        _submit_all(engine, requests, "timed")
        if on_cpu:
            memory["bandwidth_before"] = memory_bandwidth(PROBE_BYTES, PROBE_PASSES)
        with PhaseTimer(engine) as timer:
            finished = run_until_done(engine)
        if on_cpu:
            memory["bandwidth_after"] = memory_bandwidth(PROBE_BYTES, PROBE_PASSES)
            memory["read_gbs"] = max(memory["bandwidth_before"]["read_gbs"],
                                     memory["bandwidth_after"]["read_gbs"])
    finally:
        engine.shutdown()
    generated = sum(len(out.outputs[0].token_ids) for out in finished.values())
    return {"workload": summarize(requests), "workload_name": args.workload, "dtype": args.dtype,
            "quantized": args.quantized, "max_num_seqs": engine.config.max_num_seqs,
            "attention_backend": engine.attention_backend, "layers": layers,
            "output_tokens": generated, "memory": memory,
            **summarize_steps(timer.steps, memory)}


def step_memory(runner) -> dict[str, Any]:
    """What a step of ``runner``'s model must read: the weights read whole, and the KV bytes
    per token of context (K and V of every layer, with a quantized cache's scales)."""
    kv_dtype = runner.kv_caches[0][0].dtype
    per_block = kv_cache_bytes_per_block(runner.model, runner.block_size, kv_dtype)
    return {"weight_bytes": step_weight_bytes(runner.model),
            "kv_bytes_per_token": per_block / runner.block_size}


def _submit_all(engine, requests: list, tag: str) -> None:
    """Queue every request with an empty prefix cache (each pass computes every prompt)."""
    engine.reset_prefix_cache()
    for i, request in enumerate(requests):
        submit(engine, f"{tag}-{i}", request)


def summarize_steps(steps: list[StepRecord],
                    memory: dict[str, Any] | None = None) -> dict[str, Any]:
    """Totals per phase over the run, and mean milliseconds per phase for each step group;
    with ``memory`` (``step_memory`` and the measured ``read_gbs``) each group's mean bytes
    to read, the least time that takes (``bound_ms``) and ``over_bound``."""
    total = {p: sum(s.seconds[p] for s in steps) for p in PHASES}
    seconds = sum(total.values())
    groups: dict[tuple[str, str], list[StepRecord]] = {}
    for step in sorted(steps, key=lambda s: (s.kind, s.num_seqs)):  # groups in that order
        groups.setdefault((step.kind, size_group(step.num_seqs)), []).append(step)
    rows = []
    for (kind, group), members in groups.items():
        n = len(members)
        row = {
            "kind": kind, "seqs": group, "steps": n,
            "mean_seqs": sum(s.num_seqs for s in members) / n,
            "mean_tokens": sum(s.num_tokens for s in members) / n,
            "mean_rows": sum(s.num_rows for s in members) / n,
            "mean_context_tokens": sum(s.num_context_tokens for s in members) / n,
            "mean_ms": sum(s.total_s for s in members) / n * 1e3,
            "phase_ms": {p: sum(s.seconds[p] for s in members) / n * 1e3 for p in PHASES},
        }
        if memory is not None:
            row.update(memory_bound(row, memory))
        rows.append(row)
    return {"num_steps": len(steps), "seconds": seconds, "phase_seconds": total,
            "phase_share": {p: total[p] / seconds for p in PHASES}, "groups": rows,
            "steps": [s.as_dict() for s in steps]}


def memory_bound(group: dict[str, Any], memory: dict[str, Any]) -> dict[str, float]:
    """A step group's mean bytes to read, the milliseconds that takes at ``read_gbs``
    (1e9 bytes/s), and its mean step time over that."""
    read = memory["weight_bytes"] + memory["kv_bytes_per_token"] * group["mean_context_tokens"]
    bound_ms = read / (memory["read_gbs"] * 1e9) * 1e3
    return {"mean_bytes": read, "bound_ms": bound_ms, "over_bound": group["mean_ms"] / bound_ms}


def _shares(result: dict[str, Any]) -> str:
    return ", ".join(f"{p} {result['phase_share'][p]:.0%}" for p in PHASES)


def print_summary(results: dict[str, Any]) -> None:
    w = results["workload"]
    print(f"{w['num_requests']} requests, {results['output_tokens']} output tokens, "
          f"{results['num_steps']} steps, {results['seconds']:.1f} s, {_weights_label(results)}")
    print(f"share of the run: {_shares(results)}")
    memory = results.get("memory")
    if memory is not None:
        print(f"memory: {memory['weight_bytes'] / 1e6:.1f} MB of weights and "
              f"{memory['kv_bytes_per_token'] / 1e3:.1f} kB of KV per token of context to read, "
              f"at {memory['read_gbs']:.1f} GB/s (best torch.sum before and after)")
    print(f"{'kind':<8}{'seqs':>8}{'steps':>7}{'tokens':>8}{'rows':>7}{'ms':>8}"
          + "".join(f"{p:>10}" for p in PHASES)
          + (f"{'MB':>8}{'bound':>8}{'x':>6}" if memory is not None else ""))
    for g in results["groups"]:
        bound = (f"{g['mean_bytes'] / 1e6:>8.1f}{g['bound_ms']:>8.2f}{g['over_bound']:>6.2f}"
                 if memory is not None else "")
        print(f"{g['kind']:<8}{g['seqs']:>8}{g['steps']:>7}{g['mean_tokens']:>8.1f}"
              f"{g['mean_rows']:>7.1f}{g['mean_ms']:>8.1f}"
              + "".join(f"{g['phase_ms'][p]:>10.2f}" for p in PHASES) + bound)


def plot(results: dict[str, Any], out_dir, name: str) -> None:
    """Mean milliseconds per phase (stacked) for each group of steps, decode and mixed apart."""
    fig, axes = new_figure(ncols=2)
    for ax, kind in zip(axes[0], ("decode", "mixed")):
        groups = [g for g in results["groups"] if g["kind"] == kind]
        labels = [g["seqs"] for g in groups]
        bottom = [0.0] * len(groups)
        for phase in PHASES:
            heights = [g["phase_ms"][phase] for g in groups]
            ax.bar(labels, heights, bottom=bottom, color=COLORS[phase], label=phase)
            bottom = [b + h for b, h in zip(bottom, heights)]
        ax.set_xlabel("sequences in the step")
        ax.set_ylabel("mean ms per step")
        ax.set_title(f"{kind} steps ({sum(g['steps'] for g in groups)})")
    axes[0][0].legend(fontsize="small")
    save_plot(fig, out_dir, name)


def _weights_label(result: dict[str, Any]) -> str:
    """The weights the run served: its dtype (``bfloat16``), or ``w4a16 weights, bfloat16``."""
    kind = result.get("quantized")
    return f"{kind} weights, {result['dtype']}" if kind else result["dtype"]


def readme_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    w = result["workload"]
    rows = [("workload", f"{w['num_requests']} requests ({result['workload_name']}), "
                         f"{w['prompt_tokens']} prompt + {w['output_tokens']} output tokens, "
                         f"{_weights_label(result)}, {result['attention_backend']} attention"),
            ("decoder layers", result.get("layers", "Python")),
            ("run", f"{result['num_steps']} steps, {result['seconds']:.1f} s, "
                    f"{result['output_tokens'] / result['seconds']:.1f} output tok/s"),
            ("share of the run", _shares(result))]
    memory = result.get("memory")
    if memory is not None:
        rows.append(("memory", f"{memory['weight_bytes'] / 1e6:.1f} MB of weights + "
                               f"{memory['kv_bytes_per_token'] / 1e3:.1f} kB of KV per token of "
                               f"context a step reads, at {memory['read_gbs']:.1f} GB/s measured"))
    for g in result["groups"]:
        phases = ", ".join(f"{p} {g['phase_ms'][p]:.1f}" for p in PHASES)
        bound = (f"; {g['over_bound']:.2f}x the {g['bound_ms']:.2f} ms of reading "
                 f"{g['mean_bytes'] / 1e6:.1f} MB" if "bound_ms" in g else "")
        rows.append((f"{g['kind']} steps of {g['seqs']} sequences ({g['steps']} steps, "
                     f"{g['mean_tokens']:.0f} tokens, {g['mean_rows']:.0f} rows)",
                     f"{g['mean_ms']:.1f} ms: {phases}{bound}"))
    return rows
