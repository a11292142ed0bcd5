"""llama.cpp in ``bench throughput``: the build commands, the ``/completion`` protocol and its
checks, the one-request-at-a-time driver on a real (tiny) paged-core engine, and one slow
real comparison against a ``llama-server`` built from source.

The fast tests never build llama.cpp. The protocol test runs ``LlamaCpp`` against a small
stand-in executable serving the endpoints it uses over real HTTP: process start in its
own session, readiness, request bodies, response checks and shutdown are the real ones.
The slow test runs only where the bench already built ``llama-server`` into the cache.
"""
import argparse
import json
import os
import stat
import sys
import textwrap
import time
from pathlib import Path

import pytest

from paged_core.bench import llama_cpp_build, throughput
from paged_core.bench.llama_cpp import (LlamaCpp, check_completion, completion_body,
                                        ggml_cpu_features)
from paged_core.bench.one_at_a_time import run_one_at_a_time
from paged_core.bench.systems import PagedCore, RunResult
from paged_core.bench.workload import BenchRequest

from ..tiny_models import build_tiny_model

REQUESTS = [BenchRequest([11, 12, 13], 4), BenchRequest([21, 22], 6), BenchRequest([31], 1)]


def test_build_commands_ask_for_a_native_release_server_with_nothing_fetched(tmp_path):
    source, build = tmp_path / "llama.cpp", tmp_path / "build"
    configure = llama_cpp_build.configure_command("cmake", source, build)
    assert configure[:5] == ["cmake", "-S", str(source), "-B", str(build)]
    for flag in ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_SERVER=ON",
                 "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF",
                 "-DCMAKE_CXX_FLAGS=-fno-tree-dse -fno-dse"):  # ggml's AMX tile config kept
        assert flag in configure
    assert llama_cpp_build.build_command("cmake", build, 2) == [
        "cmake", "--build", str(build), "--target", "llama-server", "llama-quantize", "-j", "2"]


def test_a_build_counts_only_once_it_finished(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGED_CORE_CACHE_DIR", str(tmp_path))
    build = llama_cpp_build.build_dir()
    assert build.parent == tmp_path / "llama.cpp" / llama_cpp_build.LLAMA_CPP_PYTHON_VERSION
    assert build.name == f"build-{llama_cpp_build.cpu_key()}"
    (build / "bin").mkdir(parents=True)
    (build / "bin" / "llama-server").write_text("")  # linked, but cmake not done: not built
    assert llama_cpp_build.built_binary("llama-server") is None
    (build / llama_cpp_build.BUILT_STAMP).touch()  # a build from before llama-quantize joined
    assert llama_cpp_build.built_binary("llama-server") is None
    (build / "bin" / "llama-quantize").write_text("")
    for name in llama_cpp_build.TARGETS:
        assert llama_cpp_build.built_binary(name) == build / "bin" / name


@pytest.mark.parametrize("kind", ["q4_k_m", "q5_k_m", "iq4_xs"])
def test_k_quant_files_are_llama_quantize_of_the_bf16_one_written_whole(tmp_path, monkeypatch,
                                                                         kind):
    """``gguf_path("q4_k_m")`` (``"q5_k_m"``) runs the cached llama-quantize on the cached
    BF16 file once, into a scratch name renamed into place (here a stand-in binary that logs
    its arguments)."""
    from paged_core.bench import llama_cpp_models
    from paged_core.models.embedded_model import embedded_model_folder

    monkeypatch.setenv("PAGED_CORE_CACHE_DIR", str(tmp_path))
    name = Path(embedded_model_folder()).name
    bf16 = llama_cpp_build.version_dir() / "gguf" / f"{name}.bf16.gguf"
    bf16.parent.mkdir(parents=True)
    bf16.write_text("bf16 weights")
    build = llama_cpp_build.build_dir()
    (build / "bin").mkdir(parents=True)
    (build / llama_cpp_build.BUILT_STAMP).touch()
    (build / "bin" / "llama-server").write_text("")
    calls = tmp_path / "calls.txt"
    quantize = build / "bin" / "llama-quantize"
    quantize.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import shutil, sys
        open({str(calls)!r}, "a").write(" ".join(sys.argv[1:]) + "\\n")
        shutil.copy(sys.argv[1], sys.argv[2])
    """))
    quantize.chmod(quantize.stat().st_mode | stat.S_IXUSR)
    path = llama_cpp_models.gguf_path(kind)
    assert path == bf16.with_name(bf16.name.replace(".bf16.gguf", f".{kind.upper()}.gguf"))
    assert path.read_text() == "bf16 weights"
    assert llama_cpp_models.gguf_path(kind) == path  # cached: quantized once
    (source, outfile, file_type), = (line.split() for line in calls.read_text().splitlines())
    assert (source, file_type) == (str(bf16), kind.upper())
    assert Path(outfile).parent != path.parent and not Path(outfile).exists()  # renamed


def test_missing_cmake_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr(llama_cpp_build.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="pip install cmake"):
        llama_cpp_build.find_cmake()


def test_completion_body_asks_for_exact_greedy_uncached_output():
    assert completion_body(REQUESTS[1]) == {"prompt": [21, 22], "n_predict": 6, "temperature": 0,
                                            "ignore_eos": True, "cache_prompt": False}


def _response(predicted=6, prompt_n=2, cache_n=0):
    return {"tokens_predicted": predicted, "timings": {
        "prompt_n": prompt_n, "cache_n": cache_n, "prompt_ms": 3.0, "predicted_ms": 10.0,
        "predicted_n": predicted}}


def test_check_completion_accepts_only_exact_fully_computed_requests():
    timings = check_completion(_response(), REQUESTS[1])
    assert (timings.prompt_ms, timings.predicted_ms, timings.decode_steps) == (3.0, 10.0, 5)
    with pytest.raises(RuntimeError, match="generated 5 tokens, not 6"):
        check_completion(_response(predicted=5), REQUESTS[1])
    with pytest.raises(RuntimeError, match="computed 1 of 2 prompt tokens"):
        check_completion(_response(prompt_n=1, cache_n=1), REQUESTS[1])
    with pytest.raises(RuntimeError, match=r"\(1 from its cache\)"):
        check_completion(_response(cache_n=1), REQUESTS[1])


def test_ggml_cpu_features_come_from_the_system_info_line():
    log = ("I srv load_model: loading model\n"
           "I cmn common_param: system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : "
           "SSE3 = 1 | AVX2 = 1 | AVX512 = 0 | AVX512_BF16 = 1 | OPENMP = 1 | \nI srv done\n")
    assert ggml_cpu_features(log) == ["SSE3", "AVX2", "AVX512_BF16", "OPENMP"]
    assert ggml_cpu_features("no such line\n") == []


# A stand-in llama-server: the endpoints LlamaCpp uses, refusing any body the bench must not send.
# With several slots it serves them concurrently and reports the most completions it had in
# flight at once (``in_flight``), each held a moment so that they overlap.
STAND_IN = '''
import argparse, json, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

parser = argparse.ArgumentParser()
for flag in ("-m", "-np", "-t", "-c", "--cache-ram", "-lv", "--host", "--port"):
    parser.add_argument(flag, required=True)
args = parser.parse_args()
slots = int(args.np)
assert int(args.c) == 64 * slots, "64 tokens of context per slot"
lock, in_flight, most = threading.Lock(), [0], [0]
print("I cmn common_param: system_info: n_threads = %s / 2 | CPU : AVX2 = 1 | " % args.t,
      file=sys.stderr, flush=True)

class Handler(BaseHTTPRequestHandler):
    def _send(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send(200, {"build_info": "b1-stand-in"} if self.path == "/props" else {})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            return self._send(200, {"tokens": [ord(c) for c in body["content"]]})
        ok = (all(isinstance(t, int) for t in body["prompt"]) and body["temperature"] == 0
              and body["ignore_eos"] is True and body["cache_prompt"] is False)
        n = body["n_predict"]
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        time.sleep(0.2 if slots > 1 else 0)
        with lock:
            in_flight[0] -= 1
        self._send(200 if ok else 400, {"tokens_predicted": n, "in_flight": most[0], "timings": {
            "prompt_n": len(body["prompt"]), "cache_n": 0, "prompt_ms": 1.0,
            "predicted_ms": 2.0 * (n - 1), "predicted_n": n}})

    def log_message(self, *args):
        pass

ThreadingHTTPServer((args.host, int(args.port)), Handler).serve_forever()
'''


def _stand_in(tmp_path) -> Path:
    binary = tmp_path / "llama-server"
    binary.write_text(f"#!{sys.executable}\n" + textwrap.dedent(STAND_IN))
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return binary


@pytest.mark.extended
def test_llama_cpp_system_serves_requests_one_by_one_and_stops(tmp_path):
    system = LlamaCpp(_stand_in(tmp_path), tmp_path / "model.gguf", "llama.cpp-test", threads=2,
                      ctx_size=64)
    try:
        assert system.build_info == "b1-stand-in"
        assert system.cpu_features == ["AVX2"]
        assert system.tokenize("hi") == [104, 105]
        system.warmup()
        result = system.run(REQUESTS)
        pid = system._proc.pid
    finally:
        system.close()
    assert (result.system, result.output_tokens, result.prompt_tokens) == ("llama.cpp-test", 11, 6)
    assert result.extra["decode_steps"] == 3 + 5 + 0
    assert result.extra["decode_seconds"] == pytest.approx(2.0 * 8 / 1000)
    assert result.extra["server_seconds"] == pytest.approx((3 * 1.0 + 2.0 * 8) / 1000)
    assert result.seconds > 0 and system._proc.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.extended
def test_batched_llama_cpp_keeps_its_slots_busy(tmp_path, monkeypatch):
    """Several slots: the requests go concurrently, that many at a time, each checked; the
    run's seconds are its wall time and no per-sequence decode step is claimed."""
    requests = [BenchRequest([40 + i, 41], 3) for i in range(6)]
    system = LlamaCpp(_stand_in(tmp_path), tmp_path / "model.gguf", "llama.cpp-test", threads=2,
                      ctx_size=64, slots=3)
    seen = []
    complete = system.complete
    monkeypatch.setattr(system, "complete", lambda r: seen.append(r) or complete(r))
    try:
        assert system.command[system.command.index("-np") + 1] == "3"
        start = time.perf_counter()
        result = system.run(requests)
        elapsed = time.perf_counter() - start
        in_flight = system._client.post("/completion", json=completion_body(requests[0])).json()
    finally:
        system.close()
    assert sorted(map(id, seen)) == sorted(map(id, requests))
    assert in_flight["in_flight"] == 3  # never more than the slots, and all of them used
    assert result.output_tokens == 18 and "decode_steps" not in result.extra
    assert 0.4 <= result.seconds <= elapsed  # 6 requests of 0.2 s, 3 at a time


def _parsed(*argv):
    parser = argparse.ArgumentParser()
    throughput.add_arguments(parser)
    parser.add_argument("--quick", action="store_true")
    return parser.parse_args(list(argv))


def test_llama_cpp_slots_follow_the_batch():
    assert throughput.llama_cpp_slots(_parsed("--concurrency", "1")) == 1
    assert throughput.llama_cpp_slots(_parsed()) == throughput.DEFAULT_LLAMA_CPP_SLOTS
    assert throughput.llama_cpp_slots(_parsed("--max-num-seqs", "8")) == 8
    assert throughput.llama_cpp_slots(_parsed("--max-num-seqs", "8", "--llama-cpp-slots", "4")) == 4
    with pytest.raises(SystemExit, match="must be 1"):
        throughput.llama_cpp_slots(_parsed("--concurrency", "1", "--llama-cpp-slots", "4"))
    with pytest.raises(SystemExit, match="at least 1"):
        throughput.llama_cpp_slots(_parsed("--llama-cpp-slots", "0"))


class _Recorder:
    """A system that records the requests of each ``run`` call."""

    name = "recorder"

    def __init__(self):
        self.calls = []

    def run(self, requests):
        self.calls.append(list(requests))
        n = len(self.calls)
        return RunResult(self.name, 0.5, requests[0].prompt_len, requests[0].output_len,
                         requests[0].output_len, {"decode_seconds": 0.25, "decode_steps": 2,
                                                  "calls_so_far": n})


def test_one_at_a_time_sums_per_call_amounts_and_keeps_the_last_totals():
    system = _Recorder()
    result = run_one_at_a_time(system, REQUESTS)
    assert system.calls == [[r] for r in REQUESTS]
    assert result.seconds == pytest.approx(1.5) and result.output_tokens == 11
    assert result.extra == {"decode_seconds": 0.75, "decode_steps": 6, "calls_so_far": 3}


@pytest.fixture(scope="module")
def tiny_paged_core(tokenizer, tmp_path_factory):
    folder = build_tiny_model("llama", str(tmp_path_factory.mktemp("alone") / "llama"), tokenizer)
    return PagedCore("float32", 64 << 20, progress=False, model=folder)


def test_paged_core_one_at_a_time_never_batches_and_times_its_decode(tiny_paged_core, monkeypatch):
    llm, batches = tiny_paged_core.llm, []
    generate = llm.generate

    def recording_generate(prompts, params, use_tqdm):
        batches.append(len(prompts))  # generate returns once every prompt it got has finished
        return generate(prompts, params, use_tqdm=use_tqdm)

    monkeypatch.setattr(llm, "generate", recording_generate)
    requests = [BenchRequest(list(range(100, 100 + n)), out) for n, out in ((5, 3), (9, 7), (2, 4))]
    result = run_one_at_a_time(tiny_paged_core, requests)
    assert batches == [1, 1, 1]
    assert result.output_tokens == 14 and result.extra["decode_steps"] == 2 + 6 + 3
    assert 0 < result.extra["decode_seconds"] < result.seconds
    summary = throughput._summarize_runs({"paged-core": [result]})["paged-core"]
    assert summary["median_decode_ms_per_token"] == pytest.approx(
        1000 * result.extra["decode_seconds"] / 11)


@pytest.mark.extended
@pytest.mark.slow
@pytest.mark.skipif(llama_cpp_build.built_binary("llama-server") is None,
                    reason="llama-server not built in the cache: run `paged-core bench throughput "
                           "--concurrency 1 --llama-cpp q4_1,bf16 --quick` once (builds it, ~5 min)")
def test_real_lone_user_comparison_with_llama_cpp(tmp_path):
    from paged_core.bench.cli import main

    assert main(["throughput", "--concurrency", "1", "--llama-cpp", "q4_1,bf16",
                 "--systems", "paged-core", "--num-requests", "2", "--prompt-median", "16",
                 "--output-median", "8", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "results" / "throughput.json").read_text())
    assert result["concurrency"] == 1 and result["workload"]["num_requests"] == 2
    assert {"cpu", "cpu_isa", "cpu_flags"} <= set(result["machine"])
    assert set(result["systems"]) == {"paged-core", "llama.cpp-q4_1", "llama.cpp-bf16"}
    for name, entry in result["systems"].items():
        (run,) = entry["runs"]
        assert run["output_tokens"] == result["workload"]["output_tokens"]
        assert entry["median_decode_ms_per_token"] > 0
    for info in result["llama_cpp"].values():
        assert info["tokenizer_matches"] and info["ggml_cpu_features"]
    readme = Path(tmp_path / "README.md").read_text()
    assert "paged-core / llama.cpp-bf16 (output tok/s)" in readme
