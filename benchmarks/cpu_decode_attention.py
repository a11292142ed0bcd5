"""CPU decode attention: the torch backend with the fused C++ kernel vs its plain-torch path.

``python benchmarks/cpu_decode_attention.py [--dtype bfloat16] [--reps 30]``

Times one layer's decode attention exactly as the engine calls it
(``TorchAttentionBackend.attend`` with the step's plan already built, since every
layer of a step shares it), for both decode paths side by side in one run:
the fused kernel (``fused_cpu_decode=True``, the CPU default) and the bucketed
gather + matmul path (``fused_cpu_decode=False``, the fallback). Shapes are
SmolLM2-135M's (3 KV heads x 3 query heads each, head_dim 64, block size 16);
batches of decodes with mixed context lengths around each mean. Writes
``benchmarks/results/cpu_decode_attention.json`` and ``.png`` with the machine.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from paged_core.attention.cpu_kernels import cpu_decode_kernel_available  # noqa: E402
from paged_core.attention.metadata import AttentionMetadata  # noqa: E402
from paged_core.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from paged_core.bench.report import machine_info, new_figure, save_plot  # noqa: E402

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


def decode_step(num_seqs: int, mean_ctx: int, dtype: torch.dtype, gen: torch.Generator):
    """A head-major paged cache with shuffled blocks and one decode per sequence."""
    seq_lens = torch.randint(mean_ctx // 2, mean_ctx * 3 // 2 + 1, (num_seqs,), generator=gen)
    needed = [-(-n // BLOCK_SIZE) for n in seq_lens.tolist()]
    num_blocks = sum(needed)
    physical = torch.randperm(num_blocks, generator=gen).int()
    tables = torch.zeros(num_seqs, max(needed), dtype=torch.int32)
    used = 0
    for i, nb in enumerate(needed):
        tables[i, :nb] = physical[used:used + nb]
        used += nb
    shape = TorchAttentionBackend.kv_cache_shape(num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    query = torch.randn(num_seqs, KV_HEADS * GROUP, HEAD_DIM, generator=gen).to(dtype)
    last = seq_lens - 1
    meta = AttentionMetadata(
        slot_mapping=tables[torch.arange(num_seqs), last // BLOCK_SIZE].long() * BLOCK_SIZE
        + last % BLOCK_SIZE,
        block_tables=tables, seq_lens=seq_lens.int(),
        query_start_loc=torch.arange(num_seqs + 1, dtype=torch.int32), max_query_len=1,
        max_seq_len=int(seq_lens.max()), seq_lens_cpu=seq_lens.tolist(),
        query_lens_cpu=[1] * num_seqs)
    return query, k_cache, v_cache, meta


def measure(num_seqs: int, mean_ctx: int, dtype: torch.dtype, reps: int) -> dict:
    query, k_cache, v_cache, meta = decode_step(num_seqs, mean_ctx, dtype,
                                                torch.Generator().manual_seed(num_seqs + mean_ctx))
    row = {"num_seqs": num_seqs, "mean_ctx": mean_ctx}
    outputs = {}
    for label, fused in (("fused", True), ("torch", False)):
        backend = TorchAttentionBackend(fused_cpu_decode=fused)
        step = AttentionMetadata(**{**meta.__dict__, "backend_plans": {}})
        outputs[label] = backend.attend(query, k_cache, v_cache, step, HEAD_DIM ** -0.5)
        row[f"{label}_us"] = best_and_median_us(
            lambda: backend.attend(query, k_cache, v_cache, step, HEAD_DIM ** -0.5), reps)
    row["speedup_median"] = row["torch_us"]["median"] / row["fused_us"]["median"]
    row["max_abs_diff"] = (outputs["fused"].float() - outputs["torch"].float()).abs().max().item()
    return row


def plot(result: dict, out_dir: Path) -> None:
    fig, axes = new_figure()
    ax = axes[0][0]
    for num_seqs in sorted({r["num_seqs"] for r in result["rows"]}):
        rows = [r for r in result["rows"] if r["num_seqs"] == num_seqs]
        ctx = [r["mean_ctx"] for r in rows]
        ax.plot(ctx, [r["fused_us"]["median"] / 1e3 for r in rows], "o-",
                label=f"fused kernel, {num_seqs} seqs")
        ax.plot(ctx, [r["torch_us"]["median"] / 1e3 for r in rows], "x--",
                label=f"torch matmuls, {num_seqs} seqs")
    ax.set(xscale="log", yscale="log", xlabel="mean context length", ylabel="ms per layer (median)",
           title=f"CPU decode attention, {result['dtype']}, {result['machine']['threads']} threads")
    ax.legend(fontsize=8)
    save_plot(fig, out_dir, "cpu_decode_attention")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    if not cpu_decode_kernel_available():
        print("the fused CPU decode kernel could not be built here (see the warning above); "
              "nothing to compare", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    rows = []
    for num_seqs in (8, 64):
        for mean_ctx in (128, 512, 2048):
            rows.append(measure(num_seqs, mean_ctx, dtype, args.reps))
            r = rows[-1]
            print(f"{num_seqs:3d} seqs, ctx ~{mean_ctx:5d}: fused {r['fused_us']['median']:8.0f} us, "
                  f"torch {r['torch_us']['median']:8.0f} us, {r['speedup_median']:.2f}x", flush=True)
    result = {
        "benchmark": "cpu_decode_attention",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python benchmarks/cpu_decode_attention.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine_info(torch.get_num_threads()),
        "dtype": args.dtype,
        "shape": {"kv_heads": KV_HEADS, "group": GROUP, "head_dim": HEAD_DIM, "block_size": BLOCK_SIZE},
        "rows": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cpu_decode_attention.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out)
    print(f"wrote {out / 'cpu_decode_attention.json'} and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
