"""GPU benchmark of the paged-attention kernels (``python benchmarks/attention_timings.py``).

Reports, for one CUDA device:

- decode: achieved bandwidth of ``paged_attention`` (bytes of K/V read / time)
  across batch sizes and context lengths, next to the device's measured copy
  bandwidth (``torch`` copy of a 1 GiB tensor, read + write bytes / time), with
  the split-KV factor the heuristic picked and the time with splitting disabled;
- prefill: ``paged_attention`` time for fresh causal prefills against
  ``torch.nn.functional.scaled_dot_product_attention`` on contiguous K/V.

Writes ``benchmarks/results/kernels-<device>.json`` and ``.png``. Needs a CUDA
GPU and compiled (not interpreted) Triton: on CPU it prints why and exits with
status 2. Model shape: 32 query heads, 8 KV heads, head_dim 128 (Llama-3-8B).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

import torch

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 32, 8, 128
RESULTS = Path(__file__).resolve().parent / "results"
MAX_CACHE_TOKENS = 2**21  # 8 GiB of float16 K+V at this model shape


def bench_ms(fn) -> float:
    """Median milliseconds per call (``triton.testing.do_bench`` flushes L2 between calls)."""
    import triton.testing
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def copy_bandwidth_gbs(device: torch.device) -> float:
    """Device-to-device copy of 1 GiB: (read + write) bytes / time, in GB/s."""
    src = torch.empty(2**30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() / bench_ms(lambda: dst.copy_(src)) / 1e6


def paged_batch(seq_lens: list[int], query_lens: list[int], block_size: int,
                dtype: torch.dtype, device: torch.device) -> dict:
    """A filled cache with shuffled block tables, and the packed queries of one step."""
    from paged_core.kernels.reference import shuffled_block_tables
    tables, num_blocks = shuffled_block_tables(seq_lens, block_size)
    shape = (num_blocks, block_size, NUM_KV_HEADS, HEAD_DIM)
    starts = torch.tensor([0] + query_lens, device=device).cumsum(0).to(torch.int32)
    return dict(
        q=torch.randn(sum(query_lens), NUM_HEADS, HEAD_DIM, dtype=dtype, device=device),
        k_cache=torch.randn(shape, dtype=dtype, device=device),
        v_cache=torch.randn(shape, dtype=dtype, device=device), block_tables=tables.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=starts, scale=HEAD_DIM ** -0.5)


def bench_decode(batch_sizes, context_lens, block_size, dtype, device) -> list[dict]:
    from paged_core.kernels import choose_num_splits, paged_attention
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    rows = []
    for batch in batch_sizes:
        for ctx in context_lens:
            if batch * ctx > MAX_CACHE_TOKENS:
                continue
            args = paged_batch([ctx] * batch, [1] * batch, block_size, dtype, device)
            kv_bytes = 2 * batch * ctx * NUM_KV_HEADS * HEAD_DIM * args["q"].element_size()
            auto_ms = bench_ms(lambda: paged_attention(**args, max_seq_len=ctx, max_query_len=1))
            single_ms = bench_ms(lambda: paged_attention(**args, num_splits=1))
            splits = choose_num_splits(batch * NUM_KV_HEADS, ctx, num_sms)
            rows.append(dict(batch=batch, context=ctx, num_splits=splits, ms=auto_ms,
                             ms_no_split=single_ms, gbs=kv_bytes / auto_ms / 1e6,
                             gbs_no_split=kv_bytes / single_ms / 1e6))
            print(f"decode batch={batch:4d} ctx={ctx:6d} splits={splits:2d} "
                  f"{auto_ms * 1e3:8.1f} us {rows[-1]['gbs']:7.0f} GB/s "
                  f"(no split {rows[-1]['gbs_no_split']:7.0f} GB/s)", flush=True)
            del args
    return rows


SDPA_BACKENDS = ("flash", "cudnn", "default")  # flash: the comparator of the prefill goal


def sdpa_ms(q, k, v) -> dict[str, float | None]:
    """Median ms of causal GQA ``scaled_dot_product_attention`` per backend: forced to
    ``flash`` (FlashAttention-2) or ``cudnn``, and ``default`` (PyTorch's own pick); ``None``
    where a backend refuses the problem."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    forced = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    times: dict[str, float | None] = {}
    for name in SDPA_BACKENDS:
        def attend():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        try:
            if name in forced:
                with sdpa_kernel(forced[name]):
                    attend()
                    times[name] = bench_ms(attend)
            else:
                times[name] = bench_ms(attend)
        except RuntimeError:
            times[name] = None
    return times


def bench_prefill(batch_sizes, context_lens, block_size, dtype, device) -> list[dict]:
    """Fresh causal prefills through ``paged_attention`` against SDPA on contiguous
    ``[batch, heads, ctx, head_dim]`` tensors (``sdpa_ms``); ``ratio_to_flash`` is the paged
    kernel's time over SDPA's FlashAttention-2 backend."""
    from paged_core.kernels import paged_attention
    rows = []
    for batch in batch_sizes:
        for ctx in context_lens:
            args = paged_batch([ctx] * batch, [ctx] * batch, block_size, dtype, device)
            q = torch.randn(batch, NUM_HEADS, ctx, HEAD_DIM, dtype=dtype, device=device)
            k = torch.randn(batch, NUM_KV_HEADS, ctx, HEAD_DIM, dtype=dtype, device=device)
            v = torch.randn_like(k)
            paged_ms = bench_ms(lambda: paged_attention(**args, max_seq_len=ctx,
                                                        max_query_len=ctx))
            sdpa = sdpa_ms(q, k, v)
            flops = 2 * 2 * batch * NUM_HEADS * ctx * ctx * HEAD_DIM / 2  # causal half
            row = dict(batch=batch, context=ctx, ms=paged_ms, tflops=flops / paged_ms / 1e9,
                       **{f"sdpa_{name}_ms": ms for name, ms in sdpa.items()})
            for name, ms in sdpa.items():
                row[f"ratio_to_{name}"] = paged_ms / ms if ms else None
            rows.append(row)
            print(f"prefill batch={batch:2d} ctx={ctx:5d} paged {paged_ms:7.3f} ms "
                  f"({row['tflops']:5.1f} TFLOP/s); SDPA "
                  + ", ".join(f"{name} {ms:.3f} ms" for name, ms in sdpa.items() if ms),
                  flush=True)
            del args, q, k, v
    return rows


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_d, ax_p) = plt.subplots(1, 2, figsize=(13, 5))
    for batch in sorted({r["batch"] for r in result["decode"]}):
        rows = [r for r in result["decode"] if r["batch"] == batch]
        ax_d.plot([r["context"] for r in rows], [r["gbs"] for r in rows], "o-",
                  label=f"batch {batch}")
    ax_d.axhline(result["copy_gbs"], color="k", ls="--", label="torch copy")
    ax_d.set(xscale="log", xlabel="context length", ylabel="K/V bytes read / time (GB/s)",
             title="decode paged_attention bandwidth")
    ax_d.legend()
    for batch in sorted({r["batch"] for r in result["prefill"]}):
        rows = [r for r in result["prefill"] if r["batch"] == batch]
        ctx = [r["context"] for r in rows]
        ax_p.plot(ctx, [r["ms"] for r in rows], "o-", label=f"paged, batch {batch}")
        ax_p.plot(ctx, [r["sdpa_flash_ms"] for r in rows], "x--",
                  label=f"SDPA flash, batch {batch}")
    ax_p.set(xscale="log", yscale="log", xlabel="prompt length", ylabel="ms",
             title="causal prefill: paged_attention vs SDPA (contiguous K/V)")
    ax_p.legend()
    fig.suptitle(f"{result['device']} - {result['dtype']}, {NUM_HEADS}/{NUM_KV_HEADS} heads, "
                 f"head_dim {HEAD_DIM}, block {result['block_size']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes")
    parser.add_argument("--dtype", choices=["float16", "bfloat16"], default="float16")
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("benchmarks/attention_timings.py measures GPU kernels: it needs a CUDA device and "
              "TRITON_INTERPRET unset; none found here, nothing measured.", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    dtype = getattr(torch, args.dtype)
    name = torch.cuda.get_device_name(device)
    print(f"device: {name}", flush=True)
    quick = args.quick
    result = dict(device=name, dtype=args.dtype, block_size=args.block_size,
                  model_shape=dict(num_heads=NUM_HEADS, num_kv_heads=NUM_KV_HEADS,
                                   head_dim=HEAD_DIM),
                  torch=torch.__version__, copy_gbs=copy_bandwidth_gbs(device))
    print(f"torch copy bandwidth: {result['copy_gbs']:.0f} GB/s", flush=True)
    result["decode"] = bench_decode(
        [1, 8, 64] if quick else [1, 4, 16, 64, 256],
        [1024, 8192] if quick else [512, 2048, 8192, 32768, 131072],
        args.block_size, dtype, device)
    result["prefill"] = bench_prefill(
        [1] if quick else [1, 4], [512, 2048] if quick else [512, 1024, 2048, 4096, 8192],
        args.block_size, dtype, device)
    RESULTS.mkdir(exist_ok=True)
    stem = RESULTS / f"kernels-{re.sub(r'[^A-Za-z0-9]+', '-', name).strip('-').lower()}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2))
    plot(result, stem.with_suffix(".png"))
    print(f"wrote {stem}.json and {stem}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
