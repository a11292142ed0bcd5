"""llama.cpp's ``llama-server`` as a comparison system: one request at a time, or batched.

``LlamaCpp`` starts one long-lived ``llama-server -np SLOTS -t THREADS`` on a GGUF of the
embedded model, in a session of its own, so ``bench throughput`` can interleave its repeats
with paged-core's. With one slot it serves one request at a time; with several, ``run``
keeps that many requests in flight (a new one sent as each finishes) and llama.cpp batches
them (its continuous batching; the context is ``ctx_size`` per slot). Each request goes to ``POST /completion`` as the very token ids
the other systems get, with ``n_predict`` = its output length, ``ignore_eos``,
greedy ``temperature 0`` and ``cache_prompt: false``.

Invariants, checked on every response (a violation raises): the server
generated exactly ``output_len`` tokens, computed every prompt token (none
reused from a cache) and reports ``cache_n == 0``. A run's ``seconds`` is
the wall time of its requests as this client sees them (loopback HTTP and
JSON included); ``server_seconds`` is llama.cpp's own prompt + generation time
of the same requests, and (one slot only: batched requests share their steps)
``decode_seconds`` / ``decode_steps`` its generation phase: ``timings.predicted_ms`` over
the ``predicted_n - 1`` tokens after the first (which comes out of the prompt pass), as its
``predicted_per_token_ms`` divides.
"""
from __future__ import annotations

import contextlib
import os
from concurrent.futures import ThreadPoolExecutor
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from paged_core.adapters._process import free_port, popen_session, stop_child, wait_ready

from .llama_cpp_build import LLAMA_CPP_PYTHON_VERSION, SERVER, ensure_binary
from .llama_cpp_models import gguf_path
from .systems import RunResult, make_result
from .workload import WARMUP, BenchRequest, corpus_text, embedded_tokenizer

REQUEST_TIMEOUT_S = 600.0
TOKENIZER_SAMPLE_CHARS = 4000  # of the workload's text corpus, tokenized by both sides


def start_llama_cpp(kinds: list[str], threads: int, ctx_size: int, stack: contextlib.ExitStack,
                    slots: int = 1) -> tuple[list[LlamaCpp], dict[str, Any]]:
    """One started ``llama.cpp-<kind>`` system per GGUF kind with ``slots`` slots of
    ``ctx_size`` tokens (building llama-server and the
    GGUF files first where needed), each closed by ``stack``; and what the result file
    records about them: version, build, ggml's CPU features, GGUF file, and whether
    llama.cpp tokenizes the sample text into the ids paged-core's tokenizer gives."""
    binary = ensure_binary(SERVER, jobs=os.cpu_count() or 1)
    sample = corpus_text()[:TOKENIZER_SAMPLE_CHARS]
    expected = embedded_tokenizer().encode(sample, add_special_tokens=False)
    systems, info = [], {}
    for kind in kinds:
        system = LlamaCpp(binary, gguf_path(kind), f"llama.cpp-{kind}", threads, ctx_size, slots)
        stack.callback(system.close)
        systems.append(system)
        info[system.name] = {
            "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION, "build_info": system.build_info,
            "ggml_cpu_features": system.cpu_features, "gguf": system.model.name,
            "command": " ".join(system.command), "slots": slots,
            "tokenizer_matches": system.tokenize(sample) == expected}
        print(f"{system.name}: {system.model.name}, tokens match paged-core's: "
              f"{info[system.name]['tokenizer_matches']}; ggml CPU features: "
              f"{' '.join(system.cpu_features)}", file=sys.stderr)
    return systems, info


def server_command(binary: Path, model: Path, port: int, threads: int, ctx_size: int,
                   slots: int = 1) -> list[str]:
    """``slots`` slots (``-np``) of ``ctx_size`` tokens each (llama-server splits ``-c``
    between its slots), ``threads`` threads, loopback only.

    ``--cache-ram 0``: no host-memory prompt cache, which would copy each finished
    request's KV cache aside before the next one starts (work no request here can
    reuse). ``-lv 4``: the trace log level, the one that prints ggml's CPU features
    (``system_info``); it adds about 20 lines per request, none per token.
    """
    return [str(binary), "-m", str(model), "-np", str(slots), "-t", str(threads),
            "-c", str(ctx_size * slots),
            "--cache-ram", "0", "-lv", "4", "--host", "127.0.0.1", "--port", str(port)]


def completion_body(request: BenchRequest) -> dict[str, Any]:
    return {"prompt": request.prompt_token_ids, "n_predict": request.output_len,
            "temperature": 0, "ignore_eos": True, "cache_prompt": False}


@dataclass(frozen=True)
class Timings:
    """llama.cpp's own timing of one completion (``timings`` of the response)."""

    prompt_ms: float
    predicted_ms: float
    decode_steps: int  # tokens generated after the first one


def check_completion(response: dict[str, Any], request: BenchRequest) -> Timings:
    """The response's timings, once it shows the whole prompt computed and exactly
    ``output_len`` tokens generated (raises ``RuntimeError`` otherwise)."""
    timings = response["timings"]
    if response["tokens_predicted"] != request.output_len:
        raise RuntimeError(f"llama-server generated {response['tokens_predicted']} tokens, "
                           f"not {request.output_len}")
    if timings["prompt_n"] != request.prompt_len or timings.get("cache_n", 0) != 0:
        raise RuntimeError(f"llama-server computed {timings['prompt_n']} of {request.prompt_len} "
                           f"prompt tokens ({timings.get('cache_n')} from its cache)")
    return Timings(timings["prompt_ms"], timings["predicted_ms"], timings["predicted_n"] - 1)


def ggml_cpu_features(log_text: str) -> list[str]:
    """The CPU features ggml uses, from llama-server's ``system_info`` log line
    (``... | CPU : AVX2 = 1 | AVX512_BF16 = 1 | ...``); [] when the log has none."""
    match = re.search(r"system_info:.*?\|\s*CPU\s*:(.*)$", log_text, re.MULTILINE)
    if match is None:
        return []
    pairs = (part.split("=") for part in match.group(1).split("|") if "=" in part)
    return [name.strip() for name, value in pairs if value.strip() == "1"]


class LlamaCpp:
    """A ``warmup()`` / ``run(requests)`` system backed by a ``llama-server`` process.

    ``ctx_size`` must cover the longest request (prompt + output) it will be sent; ``slots``
    requests are in flight at once. The server dies with ``close()`` (or with this process:
    it is tied to our lifetime).
    """

    def __init__(self, binary: Path, model: Path, name: str, threads: int, ctx_size: int,
                 slots: int = 1, ready_timeout_s: float = 300.0) -> None:
        if slots < 1:
            raise ValueError(f"llama-server needs at least one slot, got {slots}")
        self.name = name
        self.model = model
        self.slots = slots
        port = free_port()
        self._log = tempfile.NamedTemporaryFile("w+", prefix=f"paged-core-{name}-", suffix=".log")
        self.command = server_command(binary, model, port, threads, ctx_size, slots)
        self._proc = popen_session(self.command, stdout=self._log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        self._client = httpx.Client(base_url=base, timeout=REQUEST_TIMEOUT_S,
                                    limits=httpx.Limits(max_connections=slots))
        try:
            try:
                wait_ready(base, self._proc, ready_timeout_s)
            except RuntimeError as exc:
                raise RuntimeError(f"{exc}; command: {' '.join(self.command)}; log tail:\n"
                                   f"{self.log_text()[-3000:]}") from None
            self.build_info = self._client.get("/props").json().get("build_info", "")
        except BaseException:
            self.close()
            raise
        self.cpu_features = ggml_cpu_features(self.log_text())

    def log_text(self) -> str:
        """What the server has logged so far (it writes the file itself)."""
        return Path(self._log.name).read_text(encoding="utf-8", errors="replace")

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's tokens for ``text``, without BOS (as ``encode(add_special_tokens=False)``)."""
        response = self._client.post("/tokenize", json={"content": text, "add_special": False})
        response.raise_for_status()
        return response.json()["tokens"]

    def warmup(self) -> None:
        self.run(WARMUP)

    def complete(self, request: BenchRequest) -> Timings:
        """One request, answered and checked."""
        response = self._client.post("/completion", json=completion_body(request))
        response.raise_for_status()
        return check_completion(response.json(), request)

    def run(self, requests: list[BenchRequest]) -> RunResult:
        """Send ``requests``: one after another with one slot, each answered before the next
        is sent (``seconds`` sums their round trips); else ``slots`` in flight at a time
        (``seconds``: the wall time from the first sent to the last answered)."""
        start = time.perf_counter()
        if self.slots == 1:
            all_timings, wall = [], 0.0
            for request in requests:
                sent = time.perf_counter()
                all_timings.append(self.complete(request))
                wall += time.perf_counter() - sent
        else:
            with ThreadPoolExecutor(self.slots) as pool:
                all_timings = list(pool.map(self.complete, requests))
            wall = time.perf_counter() - start
        server = sum(t.prompt_ms + t.predicted_ms for t in all_timings) / 1000
        if self.slots > 1:
            return make_result(self.name, wall, requests, server_seconds=server)
        return make_result(self.name, wall, requests, server_seconds=server,
                           decode_seconds=sum(t.predicted_ms for t in all_timings) / 1000,
                           decode_steps=sum(t.decode_steps for t in all_timings))

    def close(self) -> None:
        self._client.close()
        stop_child(self._proc, grace_s=10.0)
        self._log.close()
