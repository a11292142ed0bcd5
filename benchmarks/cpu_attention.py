"""CPU attention: the torch backend with its C++ kernel vs its plain-torch path.

``python benchmarks/cpu_attention.py [--dtype bfloat16] [--reps 20] [--quick]``

Times one layer's attention exactly as the engine calls it
(``TorchAttentionBackend.attend``; the plain-torch path with its per-step plan
already built, since every layer of a step shares it), both paths side by side
in one run: the C++ kernel (``cpu_kernel=True``, the CPU default) and the
bucketed gather + matmul / SDPA path (``cpu_kernel=False``, the fallback).
Steps: decodes (one new token per sequence) and fresh prefills, of mixed lengths
around each mean. Shapes are SmolLM2-135M's (3 KV heads x 3 query heads each,
head_dim 64, block size 16). Writes ``benchmarks/results/cpu_attention.json``
and ``.png`` with the machine.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from paged_core.cpu.extension import cpu_extension_available  # noqa: E402
from paged_core.attention.metadata import AttentionMetadata  # noqa: E402
from paged_core.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from paged_core.bench.report import machine_info, new_figure, save_plot  # noqa: E402
from paged_core.kernels.reference import shuffled_block_tables  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
KV_HEADS, GROUP, HEAD_DIM, BLOCK_SIZE = 3, 3, 64, 16


def best_and_median_us(fn, reps: int) -> dict[str, float]:
    """Wall microseconds per call after a warm-up (best is steadier on a shared machine)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return {"best": times[0] * 1e6, "median": times[len(times) // 2] * 1e6}


def packed_step(kind: str, num_seqs: int, mean_len: int, dtype: torch.dtype,
                gen: torch.Generator):
    """A head-major paged cache with shuffled blocks and one packed step over it:
    ``decode`` (one new token per sequence) or ``prefill`` (every token new)."""
    seq_lens = torch.randint(mean_len // 2, mean_len * 3 // 2 + 1, (num_seqs,), generator=gen)
    query_lens = torch.ones_like(seq_lens) if kind == "decode" else seq_lens.clone()
    tables, num_blocks = shuffled_block_tables(seq_lens.tolist(), BLOCK_SIZE, generator=gen)
    shape = TorchAttentionBackend.kv_cache_shape(num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    rows = torch.repeat_interleave(torch.arange(num_seqs), query_lens)
    starts = torch.cat([torch.zeros(1, dtype=torch.long), query_lens.cumsum(0)])
    positions = torch.arange(int(starts[-1])) - starts[rows] + (seq_lens - query_lens)[rows]
    query = torch.randn(len(positions), KV_HEADS * GROUP, HEAD_DIM, generator=gen).to(dtype)
    meta = AttentionMetadata(
        slot_mapping=tables[rows, positions // BLOCK_SIZE].long() * BLOCK_SIZE
        + positions % BLOCK_SIZE,
        block_tables=tables, seq_lens=seq_lens.int(), query_start_loc=starts.int(),
        max_query_len=int(query_lens.max()), max_seq_len=int(seq_lens.max()),
        seq_lens_cpu=seq_lens.tolist(), query_lens_cpu=query_lens.tolist())
    return query, k_cache, v_cache, meta


def measure(kind: str, num_seqs: int, mean_len: int, dtype: torch.dtype, reps: int) -> dict:
    query, k_cache, v_cache, meta = packed_step(kind, num_seqs, mean_len, dtype,
                                                torch.Generator().manual_seed(num_seqs + mean_len))
    row = {"kind": kind, "num_seqs": num_seqs, "mean_len": mean_len}
    outputs = {}
    for label, cpu_kernel in (("kernel", True), ("torch", False)):
        backend = TorchAttentionBackend(cpu_kernel=cpu_kernel)
        step = dataclasses.replace(meta, backend_plans={})
        outputs[label] = backend.attend(query, k_cache, v_cache, step, HEAD_DIM ** -0.5)
        row[f"{label}_us"] = best_and_median_us(
            lambda: backend.attend(query, k_cache, v_cache, step, HEAD_DIM ** -0.5), reps)
    row["speedup_median"] = row["torch_us"]["median"] / row["kernel_us"]["median"]
    row["max_abs_diff"] = (outputs["kernel"].float() - outputs["torch"].float()).abs().max().item()
    return row


SHAPES = {"decode": [(8, 128), (8, 512), (8, 2048), (64, 128), (64, 512), (64, 2048)],
          "prefill": [(1, 128), (1, 512), (1, 2048), (8, 128), (8, 512)]}
QUICK_SHAPES = {"decode": [(4, 32), (4, 64)], "prefill": [(1, 32), (2, 48)]}


def plot(result: dict, out_dir: Path) -> None:
    fig, axes = new_figure(ncols=2)
    for ax, kind in zip(axes[0], SHAPES):
        rows = [r for r in result["rows"] if r["kind"] == kind]
        for num_seqs in sorted({r["num_seqs"] for r in rows}):
            mine = [r for r in rows if r["num_seqs"] == num_seqs]
            lengths = [r["mean_len"] for r in mine]
            ax.plot(lengths, [r["kernel_us"]["median"] / 1e3 for r in mine], "o-",
                    label=f"C++ kernel, {num_seqs} seqs")
            ax.plot(lengths, [r["torch_us"]["median"] / 1e3 for r in mine], "x--",
                    label=f"plain torch, {num_seqs} seqs")
        ax.set(xscale="log", yscale="log", xlabel="mean sequence length",
               ylabel="ms per layer (median)", title=f"CPU {kind} attention, {result['dtype']}, "
                                                     f"{result['machine']['threads']} threads")
        ax.legend(fontsize=8)
    save_plot(fig, out_dir, "cpu_attention")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--quick", action="store_true", help="tiny shapes (a smoke test)")
    args = parser.parse_args(argv)
    if not cpu_extension_available():
        print("the CPU attention kernel could not be built here (see the warning above); "
              "nothing to compare", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    rows = []
    for kind, shapes in (QUICK_SHAPES if args.quick else SHAPES).items():
        for num_seqs, mean_len in shapes:
            rows.append(measure(kind, num_seqs, mean_len, dtype, args.reps))
            r = rows[-1]
            print(f"{kind:7s} {num_seqs:3d} seqs of ~{mean_len:5d}: kernel "
                  f"{r['kernel_us']['median']:9.0f} us, torch {r['torch_us']['median']:9.0f} us, "
                  f"{r['speedup_median']:.2f}x", flush=True)
    result = {
        "benchmark": "cpu_attention",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python benchmarks/cpu_attention.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine_info(torch.get_num_threads()),
        "dtype": args.dtype,
        "shape": {"kv_heads": KV_HEADS, "group": GROUP, "head_dim": HEAD_DIM, "block_size": BLOCK_SIZE},
        "rows": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cpu_attention.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out)
    print(f"wrote {out / 'cpu_attention.json'} and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
