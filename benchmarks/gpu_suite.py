"""Every GPU check and timing in one run: ``python benchmarks/gpu_suite.py --out DIR``.

Made for a lent GPU machine with no internet (torch, triton and transformers there; the
package's other needs carried as wheels). Sections, in order, each recorded in
``DIR/gpu_suite.json`` as soon as it ends (a later failure keeps the earlier results):

1. ``machine``: GPU, driver, versions; the measured ceilings (copy bandwidth, bf16 GEMM);
2. ``tests``: ``pytest tests/kernels tests/gpu`` with ``TRITON_INTERPRET=0`` (junit XML and
   log in ``DIR``);
3. ``kernels``: decode paged attention at 4k-16k contexts against the copy bandwidth, causal
   prefill against ``scaled_dot_product_attention`` (``benchmarks/attention_timings.py``'s
   functions);
   ``prefill-shapes``: candidate prefill launch shapes, timed and checked against SDPA;
4. ``engine-<shape>``: a random-weight Llama-3.2-1B- then 8B-shaped model in bfloat16:
   decode step times at batches 1/16/64/256, eager and with CUDA graphs, against the HBM
   roofline; an offline long-tailed mix of 512 requests against transformers' static and
   continuous batching (``paged_core.bench.gpu_engine``).

``--sections`` picks some; ``--deadline-s`` skips the sections that would start after it.
A short table is printed last. Needs CUDA and an importable ``paged_core.kernels`` (an
installed package, or ``kernels`` linked into a bare checkout): without either it says so and
exits with status 2.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # before anything imports triton

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("machine", "tests", "kernels", "prefill-shapes", "engine-llama-3.2-1b",
            "engine-llama-3.1-8b")
# Candidate prefill launch shapes (BLOCK_M, TILE_N, num_warps, num_stages); the first is the
# kernel's default (``paged_core.kernels.attention._launch``).
PREFILL_SHAPES = [(64, 64, 4, 3), (64, 64, 4, 2), (128, 64, 4, 3), (128, 64, 8, 3),
                  (128, 64, 8, 2), (128, 32, 8, 3), (128, 128, 8, 2)]
# Per model shape: the transformers baselines (continuous batching only at 1B: minutes at
# 8B) and the decode step modes timed (``gpu_engine.STEP_MODES``; eager only at 1B, where it
# shows what graphs save).
BASELINES = {"llama-3.2-1b": ("transformers-static", "transformers-static-512",
                              "transformers-continuous"),
             "llama-3.1-8b": ("transformers-static", "transformers-static-512")}
STEP_MODES = {"llama-3.2-1b": ("eager", "graphs", "graphs-async", "graphs-ahead"),
              "llama-3.1-8b": ("graphs", "graphs-async", "graphs-ahead")}
# paged-core's modes on the mix (``gpu_engine.MIX_MODES``; fewer at 8B, where each loads 16 GB)
MIX_MODES = {"llama-3.2-1b": ("paged-core", "paged-core-sync", "paged-core-256",
                              "paged-core-capture-256", "paged-core-async",
                              "paged-core-decode-graphs",
                              "paged-core-decode-graphs-async"),
             "llama-3.1-8b": ("paged-core", "paged-core-sync", "paged-core-256",
                              "paged-core-async")}
# every mode's name, for --mix-modes (the 1B list names them all: ``gpu_engine.MIX_MODES``)
MIX_MODE_NAMES = MIX_MODES["llama-3.2-1b"]
# What an engine section runs (``--engine-parts``): decode steps with CUDA graphs, eager decode
# steps, paged-core on the offline mix, the transformers baselines on it; only when named: a
# cProfile of the host's work in decode steps at batches 1 and 256 (``profile``), the kernels
# of the batch-1 decode graph (``kernel-profile``).
ENGINE_PARTS = ("steps", "eager-steps", "mix", "baselines", "profile", "kernel-profile")
DEFAULT_ENGINE_PARTS = ENGINE_PARTS[:4]


def _kernel_benchmarks():
    spec = importlib.util.spec_from_file_location("kernel_benchmarks", ROOT / "benchmarks"
                                                  / "attention_timings.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tokenizer():
    from transformers import AutoTokenizer
    folder = os.environ.get("PAGED_CORE_TEST_TOKENIZER")
    if not folder:
        from paged_core.models.embedded_model import embedded_model_folder
        folder = embedded_model_folder()
    return AutoTokenizer.from_pretrained(folder)


def machine(results: dict, out: Path) -> dict:
    import transformers
    import triton
    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout
    a, b = (torch.randn(8192, 8192, device=device, dtype=torch.bfloat16) for _ in range(2))
    bench = _kernel_benchmarks()
    gemm_ms = bench.bench_ms(lambda: a @ b)
    return {"gpu": props.name, "nvidia_smi": smi.strip(), "sms": props.multi_processor_count,
            "memory_gib": props.total_memory / 2**30, "torch": torch.__version__,
            "cuda": torch.version.cuda, "triton": triton.__version__,
            "transformers": transformers.__version__,
            "copy_gb_per_s": bench.copy_bandwidth_gbs(device),
            "bf16_gemm_tflops": 2 * 8192 ** 3 / gemm_ms / 1e9}


def tests(results: dict, out: Path) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "pytest", "tests/kernels", "tests/gpu", "-q", "-n", "8",
               "-p", "no:cacheprovider", "--timeout", "600", f"--junitxml={out / 'tests.xml'}"]
    started = time.perf_counter()
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    (out / "tests.log").write_text(run.stdout + run.stderr)
    summary = (run.stdout.strip().splitlines() or ["(no output)"])[-1]
    return {"returncode": run.returncode, "summary": summary,
            "seconds": time.perf_counter() - started}


def kernels(results: dict, out: Path) -> dict:
    bench = _kernel_benchmarks()
    device, dtype = torch.device("cuda"), torch.bfloat16
    copy = results["machine"]["copy_gb_per_s"]
    decode = bench.bench_decode([16, 64, 128], [4096, 8192, 16384], 16, dtype, device)
    for row in decode:
        row["fraction_of_copy"] = row["gbs"] / copy
    prefill = bench.bench_prefill([1, 4], [2048, 4096, 8192], 16, dtype, device)
    return {"dtype": "bfloat16", "decode": decode, "prefill": prefill}


def _sdpa(dense: list[torch.Tensor]) -> tuple[torch.Tensor, float, str]:
    """Causal GQA attention by SDPA, flash if it takes the problem, else SDPA's own choice:
    ``(float32 output, median ms, backend)``."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    bench = _kernel_benchmarks()

    def attend():
        return torch.nn.functional.scaled_dot_product_attention(*dense, is_causal=True,
                                                                enable_gqa=True)
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return attend().float(), bench.bench_ms(attend), "flash"
    except RuntimeError:
        return attend().float(), bench.bench_ms(attend), "default"


def prefill_shapes(results: dict, out: Path) -> dict:
    """Each candidate launch shape on two prefills (bf16, 32/8 heads, head_dim 128): time and
    relative error against SDPA flash over the same keys, gathered from the paged cache."""
    from paged_core.kernels import attention as launcher
    bench = _kernel_benchmarks()
    device, rows = torch.device("cuda"), []
    for batch, ctx in ((1, 4096), (4, 8192)):
        args = bench.paged_batch([ctx] * batch, [ctx] * batch, 16, torch.bfloat16, device)
        # SDPA gets contiguous [batch, heads, ctx, head_dim] tensors (its fastest layout)
        dense = [args["q"].view(batch, ctx, -1, bench.HEAD_DIM).transpose(1, 2).contiguous()]
        for cache in (args["k_cache"], args["v_cache"]):
            gathered = cache[args["block_tables"].long()].reshape(batch, -1, bench.NUM_KV_HEADS,
                                                                   bench.HEAD_DIM)
            dense.append(gathered[:, :ctx].transpose(1, 2).contiguous())
        expected, sdpa_ms, sdpa_backend = _sdpa(dense)
        for shape in PREFILL_SHAPES:
            launcher.PREFILL_SHAPE_OVERRIDE = shape
            try:
                out_ = launcher.paged_attention(**args, max_seq_len=ctx, max_query_len=ctx)
                got = out_.view(batch, ctx, -1, bench.HEAD_DIM).transpose(1, 2).float()
                error = float((got - expected).norm() / expected.norm())
                ms = bench.bench_ms(lambda: launcher.paged_attention(
                    **args, max_seq_len=ctx, max_query_len=ctx))
                rows.append({"batch": batch, "context": ctx, "shape": shape, "ms": ms,
                             "ratio_to_sdpa": ms / sdpa_ms, "relative_error": error,
                             "sdpa_backend": sdpa_backend})
            except Exception as exc:  # noqa: BLE001 - a shape that fails to compile is a result
                rows.append({"batch": batch, "context": ctx, "shape": shape,
                             "error": f"{type(exc).__name__}: {exc}"})
            finally:
                launcher.PREFILL_SHAPE_OVERRIDE = None
    return {"rows": rows}


def engine(shape: str):
    def run(results: dict, out: Path, parts=DEFAULT_ENGINE_PARTS, mix_modes=None) -> dict:
        from paged_core.bench import gpu_engine
        tokenizer = _tokenizer()
        section: dict = {}
        results[f"engine-{shape}"] = section  # what is done is kept if a later part fails
        modes = [mode for mode in STEP_MODES[shape]
                 if ("eager-steps" if mode == "eager" else "steps") in parts]
        with tempfile.TemporaryDirectory() as tmp:
            folder = gpu_engine.random_model(shape, tmp, tokenizer)
            if modes:
                section["decode_steps"] = gpu_engine.decode_step_times(
                    folder, results["machine"]["copy_gb_per_s"], modes=modes)
                save(results, out)
            if "kernel-profile" in parts:
                section["kernel_breakdown"] = gpu_engine.kernel_breakdown(folder)
                save(results, out)
            if "profile" in parts:
                section["host_profile"] = [gpu_engine.host_profile(folder, batch=batch)
                                           for batch in (1, 256)]
                save(results, out)
            if "mix" in parts:
                baselines = BASELINES[shape] if "baselines" in parts else ()
                section["offline_mix"] = gpu_engine.offline_mix(
                    folder, tokenizer, modes=mix_modes or MIX_MODES[shape], baselines=baselines)
        return section
    return run


RUNNERS = {"machine": machine, "tests": tests, "kernels": kernels,
           "prefill-shapes": prefill_shapes,
           "engine-llama-3.2-1b": engine("llama-3.2-1b"),
           "engine-llama-3.1-8b": engine("llama-3.1-8b")}


def table(results: dict) -> str:
    lines = []
    m = results.get("machine", {})
    if "gpu" in m:
        lines.append(f"{m['gpu']} | copy {m['copy_gb_per_s']:.0f} GB/s | bf16 GEMM "
                     f"{m['bf16_gemm_tflops']:.0f} TFLOP/s | torch {m['torch']} triton "
                     f"{m['triton']}")
    if "tests" in results:
        t = results["tests"]
        lines.append(f"tests: {t.get('summary', t)}")
    for row in results.get("kernels", {}).get("decode", []):
        lines.append(f"decode attn b={row['batch']:3d} ctx={row['context']:5d}: "
                     f"{row['gbs']:6.0f} GB/s = {row['fraction_of_copy']:.0%} of copy")
    for row in results.get("kernels", {}).get("prefill", []):
        ratios = ", ".join(f"{value:.2f}x SDPA {key.removeprefix('ratio_to_')}"
                           for key, value in row.items() if key.startswith("ratio_to_") and value)
        lines.append(f"prefill attn b={row['batch']} n={row['context']:5d}: {row['ms']:.3f} ms, "
                     + ratios)
    for row in results.get("prefill-shapes", {}).get("rows", []):
        lines.append(f"prefill shape {row['shape']} b={row['batch']} n={row['context']}: "
                     + (f"{row['ratio_to_sdpa']:.2f}x SDPA, error {row['relative_error']:.1e}"
                        if "ms" in row else row["error"][:80]))
    for shape in SECTIONS[4:]:
        section = results.get(shape, {})
        for row in section.get("decode_steps", []):
            if "batch" in row:
                replay = row.get("graph_replay_ms")
                lines.append(f"{shape} {row['mode']:12} b={row['batch']:3d}: "
                             f"{row['step_ms']:.2f} ms/step, {row['over_roofline']:.2f}x roofline"
                             + (f" (graph replay {replay:.2f} ms)" if replay else ""))
        breakdown = section.get("kernel_breakdown", {})
        if "kernels" in breakdown:
            lines.append(f"{shape} graph b={breakdown['batch']}: "
                         f"{breakdown['kernels_per_replay']:.0f} kernels, "
                         f"{breakdown['kernel_us_per_replay']:.0f} us in kernels of a "
                         f"{breakdown['span_us_per_replay']:.0f} us span; top: "
                         + "; ".join(f"{row['name'][:40]} {row['us_per_replay']:.0f}"
                                     for row in breakdown["kernels"][:5]))
        for profile in section.get("host_profile", []):
            lines.append(f"{shape} host profile b={profile['batch']}: "
                         f"{profile['profiled_ms_per_step']:.2f} ms/step under cProfile; top: "
                         + "; ".join(f"{row['function'].rsplit('/', 1)[-1]} "
                                     f"{row['own_ms_per_step']:.2f}"
                                     for row in profile["functions"][:6]))
        for name, value in section.get("offline_mix", {}).items():
            if isinstance(value, dict) and "output_tok_per_s" in value:
                lines.append(f"{shape} mix {name}: {value['output_tok_per_s']:.0f} tok/s")
    for name, value in results.items():
        if isinstance(value, dict) and "error" in value:
            lines.append(f"{name}: ERROR {value['error'].splitlines()[-1]}")
    return "\n".join(lines)


def save(results: dict, out: Path) -> None:
    """Write what is measured so far to ``out/gpu_suite.json`` (a run cut short keeps it)."""
    (out / "gpu_suite.json").write_text(json.dumps(results, indent=2, default=str))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--deadline-s", type=float, default=float("inf"))
    parser.add_argument("--engine-parts", nargs="+", choices=ENGINE_PARTS,
                        default=list(DEFAULT_ENGINE_PARTS))
    parser.add_argument("--mix-modes", nargs="+", choices=MIX_MODE_NAMES,
                        help="paged-core's modes on the offline mix, in this order (default: "
                             "each shape's own list, the defaults first)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/gpu_suite.py needs a CUDA GPU; none here, nothing measured.",
              file=sys.stderr)
        return 2
    if importlib.util.find_spec("paged_core.kernels") is None:
        print("benchmarks/gpu_suite.py needs paged_core.kernels (kernels/ in the tree): install "
              "the package (pip install --no-deps -e .) or, in a bare checkout, run "
              "ln -s ../kernels paged_core/kernels first; nothing measured.", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {"command": " ".join(["python", "benchmarks/gpu_suite.py", *sys.argv[1:]])}
    started = time.perf_counter()
    for name in args.sections:
        if time.perf_counter() - started > args.deadline_s:
            results[name] = {"skipped": f"past the {args.deadline_s:.0f} s deadline"}
            continue
        section_start = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            runner = RUNNERS[name]
            results[name] = (runner(results, args.out, args.engine_parts, args.mix_modes)
                             if name.startswith("engine-") else runner(results, args.out))
        except Exception:  # noqa: BLE001 - one section's failure must not lose the others
            results[name] = {**results.get(name, {}), "error": traceback.format_exc()}
            print(results[name]["error"], flush=True)
        results[name]["section_seconds"] = time.perf_counter() - section_start
        save(results, args.out)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
