"""A comparison system whose ``LLM`` runs in its own long-lived interpreter.

Some systems cannot share ``bench throughput``'s process: vLLM lives in a separate
environment, and a second paged-core (another source tree, for a before/after
comparison) would collide with this one's modules. ``LlmProcess`` starts one worker in
that interpreter: it imports the engine module (``vllm`` or ``paged_core``: both offer
vLLM's ``LLM`` and ``SamplingParams``), loads the model once, then times
``LLM.generate`` for every workload it is sent (one JSON line on its stdin, one result
line on its stdout). The worker stays up, so its repeats interleave with the other
systems' and a drifting machine load hits all of them alike. Greedy decoding, exact
output lengths (``ignore_eos``), the prefix cache reset before every timed run.
"""
from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from .systems import RunResult, make_result
from .workload import WARMUP, BenchRequest

RESULT_PREFIX = "PAGED_CORE_BENCH_RESULT "

WORKER_SCRIPT = '''
import importlib, json, sys, time

def main():
    spec = json.loads(sys.argv[1])
    engine = importlib.import_module(spec["module"])  # first: it may set OpenMP up before torch
    import torch
    torch.set_num_threads(spec["threads"])
    llm = engine.LLM(model=spec["model"], dtype=spec["dtype"], **spec["llm_args"])
    print(PREFIX + json.dumps({"version": engine.__version__}), flush=True)
    for line in sys.stdin:
        work = json.loads(line)
        prompts = [{"prompt_token_ids": p} for p in work["prompts"]]
        params = [engine.SamplingParams(max_tokens=n, ignore_eos=True, temperature=0)
                  for n in work["outputs"]]
        llm.reset_prefix_cache()  # no hits on the previous run's prompts
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        assert [len(o.outputs[0].token_ids) for o in outs] == work["outputs"]
        print(PREFIX + json.dumps({"seconds": seconds}), flush=True)

if __name__ == "__main__":
    main()
'''


class LlmProcess:
    """A ``warmup()`` / ``run(requests)`` system backed by a worker process running
    ``module``'s ``LLM(model, dtype, **llm_args)`` under ``python`` with ``env``.

    The worker dies with ``close()`` (or when this process exits: its stdin closes).
    Results carry ``{version_key: module.__version__}``.
    """

    def __init__(self, name: str, python: str, module: str, dtype: str, threads: int,
                 llm_args: dict[str, Any], env: dict[str, str], version_key: str) -> None:
        from paged_core.models.embedded_model import embedded_model_folder

        self.name, self._version_key = name, version_key
        self._tmp = tempfile.TemporaryDirectory(prefix="paged-core-bench-worker-")
        script = Path(self._tmp.name) / "llm_worker.py"
        script.write_text(f"PREFIX = {RESULT_PREFIX!r}\n" + WORKER_SCRIPT, encoding="utf-8")
        self._stderr = open(Path(self._tmp.name) / "stderr.log", "w+", encoding="utf-8")
        spec = {"module": module, "model": embedded_model_folder(), "dtype": dtype,
                "threads": threads, "llm_args": llm_args}
        self._proc = subprocess.Popen([python, str(script), json.dumps(spec)], text=True, env=env,
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
        return make_result(self.name, self._generate(requests), requests,
                           **{self._version_key: self.version})

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
        """The next result line of the worker; raises with its stderr tail if it exits first."""
        for line in self._proc.stdout:
            if line.startswith(RESULT_PREFIX):
                return json.loads(line[len(RESULT_PREFIX):])
        self._proc.wait()
        self._stderr.seek(0)
        tail = self._stderr.read()[-2000:]
        raise RuntimeError(f"{self.name} worker exited ({self._proc.returncode}): {tail}")
