"""``bench attention``: the C++ CPU attention per CPU path against this machine's memory bandwidth and linear FLOP rate.

For every CPU path level this host supports (``paged_core.cpu.isa``; ``generic``, slow,
only with ``--full``), each level's own build of the kernel (``cpu_paged_attention(...,
cpu_isa=level)``, all loaded side by side; the ``avx512_bf16`` level's bfloat16 tiles on
``vdpbf16ps``, and again on AMX tiles as path ``avx512_bf16+amx`` where the CPU has
AMX-BF16), in bfloat16 and float32 (the kernel's dtypes; the common ``--dtype`` is not
used):

- decode: one new token per sequence, over a grid of batch sizes and context lengths, for
  SmolLM2-135M's shape (3 KV heads x 3 query heads, head_dim 64) and a Llama-8B-like one
  (8 KV heads x 4, head_dim 128), in blocks of ``--block-size`` tokens (default the
  engine's, 16: each block is one run of K and one of V per KV head, so larger blocks read
  longer runs; vLLM-CPU takes 128 by default), each sequence's blocks ``scattered`` at
  random places in the pool (every block its own run: the worst case) and again
  ``consecutive`` (one run per sequence and KV head, as the engine's allocator mostly hands
  a prompt's blocks out; ``attention_cases.BLOCK_LAYOUTS``). The KV pool is far larger than the
  last-level cache and each call reads blocks no recent call read (``attention_cases``),
  so achieved GB/s (bytes of K and V read / median time) is set against the memory
  bandwidth measured in the same run, before and after (best ``torch.sum`` over a large
  tensor, ``machine_rates``): ``fraction_of_bandwidth`` = achieved / measured;
- prefill: fresh causal prompts (SmolLM2 shape), their K and V read from cache as in the
  engine, where the layer writes them just before it attends (every call reads the same
  blocks), GFLOP/s = ``4 * T(T+1)/2 * head_dim * heads`` per sequence / median time, next
  to the FLOP rate of the layer's projections on the same tokens through the linear the
  engine uses for that dtype and level (``linear_over_attention`` = linear rate /
  attention rate: the target is <= 2), and
  torch's ``scaled_dot_product_attention`` (contiguous K/V, ``is_causal``, ``enable_gqa``)
  on the same shapes as row ``torch_sdpa``.

A level caps paged-core's own C++ kernels only: torch's kernels (the oneDNN linears, SDPA,
the bandwidth probe) use every ISA this host has, so a capped level's linear rate is that
of its kind of linear on this host, not on a CPU that stops at that level.

Every case times its paths in interleaved rounds (``interleaved_timing``) and reports
medians. Run with ``OMP_WAIT_POLICY=PASSIVE``; rates on a loaded machine are lower bounds
(see ``load_average_before`` / ``_after``).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

import torch

from ..config.cache_config import BLOCK_SIZES, CacheConfig
from ..cpu.extension import cpu_extension_available, cpu_extension_error, cpu_ops
from ..cpu.isa import has_amx_bf16, supported_cpu_isas
from ..cpu.kv_prefetch import selected_kv_prefetch
from .attention_cases import (BLOCK_LAYOUTS, LLAMA_8B, SMOLLM2, KvPool, ModelShape,
                              blocks_for, kv_pool, paged_step, sdpa_call)
from .attention_plot import plot  # noqa: F401 - the benchmark's ``plot(results, out_dir, name)``
from .interleaved_timing import median_us, time_interleaved
from .machine_rates import linear_call, linear_flops, linear_kind, memory_bandwidth
from .report import command_line, cpu_model

NAME = "attention"
DTYPES = ("bfloat16", "float32")
SDPA = "torch_sdpa"
AMX_PATH = "avx512_bf16+amx"  # the avx512_bf16 build, bfloat16 tiles on AMX
MIB = 2**20
GRID = {"decode_shapes": [SMOLLM2, LLAMA_8B], "batches": [1, 4, 16, 64],
        "contexts": [128, 512, 2048], "prefill_shapes": [SMOLLM2], "prefill_batches": [1, 4],
        "prompts": [128, 512, 2048], "pool_mib": 512, "bandwidth_mib": 1024,
        "bandwidth_passes": 5, "min_sample_ms": 2.0}
QUICK_GRID = {"decode_shapes": [SMOLLM2], "batches": [1, 2], "contexts": [16, 40],
         "prefill_shapes": [SMOLLM2], "prefill_batches": [1, 2], "prompts": [16, 40],
         "pool_mib": 8, "bandwidth_mib": 64, "bandwidth_passes": 2, "min_sample_ms": 0.2,
         "reps": 2}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reps", type=int, default=9, help="timed rounds per case (median)")
    parser.add_argument("--full", action="store_true",
                        help="also the generic level (plain C++, no vector ISA flags: slow)")
    parser.add_argument("--block-size", type=int, choices=BLOCK_SIZES,
                        default=CacheConfig.block_size,
                        help="tokens per KV block (default: the engine's default)")


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    grid = QUICK_GRID if args.quick else GRID
    sized = {key: [dataclasses.replace(shape, block_size=args.block_size) for shape in grid[key]]
             for key in ("decode_shapes", "prefill_shapes")}
    return {"reps": args.reps, "block_size": args.block_size, **grid, **sized}


def _levels(full: bool) -> tuple[list[str], dict[str, str]]:
    """(levels to time, {level: why its kernels are unavailable}): every supported level,
    ``generic`` only with ``full`` or when it is the only one."""
    supported = supported_cpu_isas()
    wanted = supported if full else supported[1:] or supported
    levels = [level for level in wanted if cpu_extension_available(level)]
    return levels, {level: cpu_extension_error(level) for level in wanted if level not in levels}


def _paths(levels: list[str], dtype: str) -> dict[str, tuple[str, bool]]:
    """{path: (level, amx_tiles)} timed for ``dtype``: every level with its tiles on
    ``vdpbf16ps``, and ``AMX_PATH`` for bfloat16 where the avx512_bf16 build may use AMX."""
    paths = {level: (level, False) for level in levels}
    if dtype == "bfloat16" and "avx512_bf16" in levels and _amx_tiles_granted():
        paths[AMX_PATH] = ("avx512_bf16", True)
    return paths


def _amx_tiles_granted() -> bool:
    return has_amx_bf16() and cpu_ops("avx512_bf16").bf16_amx_ready()


def run(args: argparse.Namespace) -> dict[str, Any]:
    s = _settings(args)
    levels, unavailable = _levels(args.full)
    generator = torch.Generator().manual_seed(args.seed)
    load_before = os.getloadavg()[0]
    before = memory_bandwidth(s["bandwidth_mib"] * MIB, s["bandwidth_passes"])
    decode, prefill = [], []
    for dtype in DTYPES:
        for shape in dict.fromkeys(s["decode_shapes"] + s["prefill_shapes"]):
            pool = kv_pool(shape, getattr(torch, dtype), _pool_blocks(shape, dtype, s), generator)
            paths = _paths(levels, dtype)
            if shape in s["decode_shapes"]:
                decode += _decode_rows(pool, paths, s, generator)
            if shape in s["prefill_shapes"]:
                prefill += _prefill_rows(pool, paths, s, generator)
            del pool  # before the next one is allocated
    after = memory_bandwidth(s["bandwidth_mib"] * MIB, s["bandwidth_passes"])
    load_after = os.getloadavg()[0]
    bandwidth = {key: max(before[key], after[key]) for key in before}
    for row in decode:
        row["fraction_of_bandwidth"] = row["gbs"] / bandwidth["read_gbs"]
    settings = {k: [v.name for v in s[k]] if k.endswith("shapes") else v for k, v in s.items()}
    settings["kv_prefetch"] = selected_kv_prefetch()  # the avx512_bf16 decode loop's
    return {"dtypes": list(DTYPES), "levels": levels, "unavailable_levels": unavailable,
            "paths": list(_paths(levels, "bfloat16")),
            "shapes": {shape.name: dataclasses.asdict(shape)
                       for shape in s["decode_shapes"] + s["prefill_shapes"]},
            "settings": settings, "machine_summary": f"{cpu_model()}, {os.cpu_count()} cores",
            "run_command": command_line(getattr(args, "argv", [NAME])),
            "bandwidth": {**bandwidth, "before": before, "after": after},
            "decode": decode, "prefill": prefill, "load_average_before": load_before,
            "load_average_after": load_after, "method": __doc__.split("\n\n", 1)[1].strip(),
            "notes": _notes(max(load_before, load_after))}


def _pool_blocks(shape: ModelShape, dtype: str, s: dict[str, Any]) -> int:
    """``pool_mib`` of K and V, or more if the largest step of the grid needs it."""
    block_bytes = shape.kv_bytes(shape.block_size, getattr(torch, dtype))
    largest = max(blocks_for(shape, max(s["batches"]), max(s["contexts"])),
                  blocks_for(shape, max(s["prefill_batches"]), max(s["prompts"])))
    return max(largest, s["pool_mib"] * MIB // block_bytes)


def _case(pool: KvPool, **fields: Any) -> dict[str, Any]:
    return {"shape": pool.shape.name, "dtype": str(pool.dtype).removeprefix("torch."), **fields}


def _timing(seconds: list[float]) -> dict[str, Any]:
    return {"us_median": median_us(seconds), "us_samples": [round(t * 1e6, 2) for t in seconds]}


def _decode_rows(pool: KvPool, paths: dict[str, tuple[str, bool]], s: dict[str, Any],
                 generator: torch.Generator) -> list[dict[str, Any]]:
    rows = []
    for batch in s["batches"]:
        for context in s["contexts"]:
            steps = {layout: paged_step(pool, batch, context, 1, generator, layout)
                     for layout in BLOCK_LAYOUTS}
            kv_bytes = pool.shape.kv_bytes(batch * context, pool.dtype)
            calls = {(layout, path): step.call(*how) for layout, step in steps.items()
                     for path, how in paths.items()}
            samples = time_interleaved(calls, s["reps"], s["min_sample_ms"] / 1e3)
            for (layout, path), seconds in samples.items():
                t = _timing(seconds)
                rows.append(_case(pool, batch=batch, context=context, blocks=layout,
                                  kv_bytes=kv_bytes, table_copies=steps[layout].instances,
                                  path=path, **t, gbs=kv_bytes / t["us_median"] / 1e3))
    return rows


def _prefill_rows(pool: KvPool, paths: dict[str, tuple[str, bool]], s: dict[str, Any],
                  generator: torch.Generator) -> list[dict[str, Any]]:
    shape, dtype = pool.shape, pool.dtype
    rows = []
    for batch in s["prefill_batches"]:
        for prompt in s["prompts"]:
            # K and V as the layer just wrote them: in cache (attention_cases)
            step = paged_step(pool, batch, prompt, prompt, generator, copies=1)
            calls = {path: step.call(*how) for path, how in paths.items()}
            calls[SDPA] = sdpa_call(shape, dtype, batch, prompt, generator)
            kinds = {path: linear_kind(dtype, level) for path, (level, _) in paths.items()}
            for path, kind in kinds.items():  # each kind of linear timed once
                if kind not in calls:
                    calls[kind] = linear_call(shape, dtype, paths[path][0], batch * prompt,
                                              generator)
            samples = time_interleaved(calls, s["reps"], s["min_sample_ms"] / 1e3)
            flops = batch * shape.causal_flops(prompt)
            lin_flops = linear_flops(shape, batch * prompt)
            for path in [*paths, SDPA]:
                t = _timing(samples[path])
                row = _case(pool, batch=batch, prompt=prompt, flops=flops, path=path, **t,
                            table_copies=step.instances, gflops=flops / t["us_median"] / 1e3)
                if path in kinds:
                    linear_gflops = lin_flops / median_us(samples[kinds[path]]) / 1e3
                    row.update(linear=kinds[path], linear_flops=lin_flops,
                               linear_gflops=linear_gflops,
                               linear_over_attention=linear_gflops / row["gflops"])
                rows.append(row)
    return rows


def _notes(load: float) -> list[str]:
    cores = os.cpu_count() or 1
    notes = ["a CPU path level caps paged-core's C++ kernels only; the linears and torch SDPA "
             "use every ISA of this host at every level"]
    if load >= cores:
        notes.append(f"the machine was busy (load average up to {load:.1f} on {cores} cores, "
                     f"before and after): every rate here is a lower bound, comparable only "
                     f"within the run")
    return notes


def _by(rows: list[dict[str, Any]], *keys: str) -> dict[tuple, dict[str, dict[str, Any]]]:
    """``{(row[k] for k in keys): {path: row}}``, in the rows' order (a decode row of a run
    before block layouts were timed is ``scattered``)."""
    table: dict[tuple, dict[str, dict[str, Any]]] = {}
    for row in rows:
        key = tuple(row.get(k, "scattered") if k == "blocks" else row[k] for k in keys)
        table.setdefault(key, {})[row["path"]] = row
    return table


def print_summary(results: dict[str, Any]) -> None:
    bw = results["bandwidth"]
    print(f"{results['machine_summary']}; memory bandwidth {bw['read_gbs']:.1f} GB/s read, "
          f"{bw['copy_gbs']:.1f} GB/s copy; load {results['load_average_before']:.1f} -> "
          f"{results['load_average_after']:.1f}")
    columns = results.get("paths", results["levels"])  # older results: levels only
    blank = f"{'-':>26}"
    print(f"decode, blocks of {results['settings'].get('block_size', 16)} tokens"
          f"{_prefetch_label(results['settings'])}: median us, GB/s of K+V read, fraction of "
          f"measured bandwidth")
    print(f"{'shape':<15}{'dtype':<10}{'blocks':<12}{'batch':>6}{'ctx':>6}"
          + "".join(f"{path:>26}" for path in columns))
    for (shape, dtype, blocks, batch, ctx), paths in _by(
            results["decode"], "shape", "dtype", "blocks", "batch", "context").items():
        print(f"{shape:<15}{dtype:<10}{blocks:<12}{batch:>6}{ctx:>6}" + "".join(
            f"{paths[p]['us_median']:>10.0f}{paths[p]['gbs']:>9.2f}"
            f"{paths[p]['fraction_of_bandwidth']:>7.0%}" if p in paths else blank
            for p in columns))
    print("prefill: GFLOP/s of attention / of the layer's linears (ratio)")
    print(f"{'shape':<15}{'dtype':<10}{'batch':>6}{'prompt':>7}"
          + "".join(f"{path:>26}" for path in columns) + f"{SDPA:>12}")
    for (shape, dtype, batch, prompt), paths in _by(results["prefill"], "shape", "dtype",
                                                    "batch", "prompt").items():
        print(f"{shape:<15}{dtype:<10}{batch:>6}{prompt:>7}" + "".join(
            f"{paths[p]['gflops']:>9.1f} /{paths[p]['linear_gflops']:>7.1f}"
            f"{paths[p]['linear_over_attention']:>8.1f}x" if p in paths else blank
            for p in columns) + f"{paths[SDPA]['gflops']:>12.1f}")
    for note in results["notes"]:
        print(f"note: {note}")


def _prefetch_label(settings: dict[str, Any]) -> str:
    """`` (KV prefetch <policy>)`` where the result records the decode loop's policy (runs
    before it was a setting do not)."""
    policy = settings.get("kv_prefetch")
    return f" (KV prefetch {policy})" if policy else ""


def readme_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    s, bw = result["settings"], result["bandwidth"]
    rows = [("memory bandwidth (measured)",
             f"{bw['read_gbs']:.1f} GB/s read (sum), {bw['copy_gbs']:.1f} GB/s copy; best of "
             f"{s['bandwidth_passes']} passes over {s['bandwidth_mib']} MiB, before and after"),
            ("load average", f"{result['load_average_before']:.1f} before, "
                             f"{result['load_average_after']:.1f} after")]
    decode = _by(result["decode"], "shape", "dtype", "blocks", "batch", "context")
    for (shape, dtype, blocks, batch, ctx), paths in decode.items():
        if batch == max(s["batches"]) and ctx == max(s["contexts"]):
            rows.append((f"decode {dtype}, {shape}, {batch} seqs x {ctx} tokens in blocks of "
                         f"{s.get('block_size', 16)}, {blocks}{_prefetch_label(s)}", ", ".join(
                f"{lv} {r['gbs']:.1f} GB/s ({r['fraction_of_bandwidth']:.0%})"
                for lv, r in paths.items())))
    prefill = _by(result["prefill"], "shape", "dtype", "batch", "prompt")
    for (shape, dtype, batch, prompt), paths in prefill.items():
        if batch == 1 and prompt == max(s["prompts"]):
            rows.append((f"prefill {dtype}, {shape}, one {prompt}-token prompt", ", ".join(
                f"{lv} {r['gflops']:.1f} GFLOP/s" + (
                    f" (linears {r['linear_gflops']:.0f}: {r['linear_over_attention']:.1f}x)"
                    if "linear" in r else "") for lv, r in paths.items())))
    return rows
