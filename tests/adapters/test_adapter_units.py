"""Adapter pieces that need no running server: settings round trips, Triton repository
and request parsing, launcher environment, LitServe's probe API."""
from __future__ import annotations

import dataclasses
import json
import pickle
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from paged_core import EngineConfig, SamplingParams
from paged_core.adapters._settings import config_env, config_strings
from paged_core.adapters.launch import serve

CONFIG = EngineConfig(dtype="float32", block_size=32, num_kv_blocks=64, max_model_len=256,
                      enable_prefix_caching=False, served_model_name="tiny")


@pytest.mark.parametrize("config", [CONFIG, dataclasses.replace(
    CONFIG, speculative_config={"method": "ngram", "num_speculative_tokens": 3},
    kv_events_config={"enable_kv_cache_events": True, "endpoint": "tcp://*:5600", "topic": "t"})])
def test_config_survives_strings_and_env(config):
    """Dict settings travel as JSON (to a server's environment, Triton's config.pbtxt)."""
    assert EngineConfig.from_strings(config_strings(config)) == config
    assert EngineConfig.from_env(environ=config_env(config)) == config


def test_write_repository_renders_name_and_engine_parameters(tmp_path):
    from paged_core.adapters.triton_server import write_repository

    write_repository(tmp_path, CONFIG, model_name="llm2")
    text = (tmp_path / "llm2" / "config.pbtxt").read_text()
    assert re.search(r'^name: "llm2"$', text, re.M)
    assert "decoupled: true" in text
    params = dict(re.findall(r'parameters \{ key: "(\w+)" value: \{ string_value: ("[^"]*") \} \}',
                             text))
    assert EngineConfig.from_strings({k: json.loads(v) for k, v in params.items()}) == CONFIG
    assert "TritonPythonModel" in (tmp_path / "llm2" / "1" / "model.py").read_text()
    with pytest.raises(ValueError, match="model_name"):
        write_repository(tmp_path, CONFIG, model_name="bad name")


def test_triton_request_parsing():
    from paged_core.adapters.triton_server.request_parsing import parse_request

    text = np.array([b"hello"], dtype=np.object_)
    params = np.array([json.dumps({"max_tokens": 3, "temperature": 0}).encode()], dtype=np.object_)
    prompt, stream, sp, lora = parse_request(text, np.array([True]), params)
    assert (prompt, stream, sp.max_tokens, sp.temperature, lora) == ("hello", True, 3, 0, None)
    _, stream, sp, _ = parse_request(text, None, None)
    assert stream is False and sp == SamplingParams()
    with_lora = np.array([json.dumps({"max_tokens": 2, "lora_name": "sql"}).encode()],
                         dtype=np.object_)
    _, _, sp, lora = parse_request(text, None, with_lora)  # vllm_backend's key
    assert lora == "sql" and sp.max_tokens == 2
    with pytest.raises(ValueError, match="lora_name must be a non-empty string"):
        parse_request(text, None, np.array([b'{"lora_name": 3}'], dtype=np.object_))
    for bad, fragment in ((np.array([b'{"max_tokens": '], dtype=np.object_), "JSON"),
                          (np.array([b"[1]"], dtype=np.object_), "JSON object"),
                          (np.array([b'{"max_tokens": -1}'], dtype=np.object_), "max_tokens"),
                          (np.array([b'{"nope": 1}'], dtype=np.object_), "unknown")):
        with pytest.raises(ValueError, match=fragment):
            parse_request(text, None, bad)
    with pytest.raises(ValueError, match="text_input"):
        parse_request(np.array([b""], dtype=np.object_), None, None)


def test_triton_sampling_parameters_take_structured_outputs():
    from paged_core import StructuredOutputsParams
    from paged_core.adapters.triton_server.request_parsing import parse_request

    text = np.array([b"hello"], dtype=np.object_)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    raw = json.dumps({"max_tokens": 8, "structured_outputs": {"json": schema}}).encode()
    _, _, sp, _ = parse_request(text, None, np.array([raw], dtype=np.object_))
    assert sp.structured_outputs == StructuredOutputsParams(json=schema)
    bad = json.dumps({"structured_outputs": {"regex": "("}}).encode()
    with pytest.raises(ValueError, match=r"structured_outputs\.regex"):
        parse_request(text, None, np.array([bad], dtype=np.object_))
    tools_config = EngineConfig(tool_call_parser="llama3_json")
    assert EngineConfig.from_env(environ=config_env(tools_config)) == tools_config
    with pytest.raises(ValueError, match="tool_call_parser"):
        EngineConfig(tool_call_parser="mistral")


def test_triton_sampling_parameters_take_logit_edits():
    """JSON object keys are strings: logit_bias's become token ids, as the OpenAI route's do."""
    from paged_core.adapters.triton_server.request_parsing import parse_request

    text = np.array([b"hello"], dtype=np.object_)
    raw = json.dumps({"logit_bias": {"17": -100, "9": 2.5}, "allowed_token_ids": [9, 17, 30]})
    _, _, sp, _ = parse_request(text, None, np.array([raw.encode()], dtype=np.object_))
    assert sp.logit_bias == {17: -100.0, 9: 2.5} and sp.allowed_token_ids == [9, 17, 30]
    with pytest.raises(ValueError, match="logit_bias keys must be token ids"):
        parse_request(text, None, np.array([b'{"logit_bias": {"a": 1}}'], dtype=np.object_))


def test_triton_launcher_environment(tmp_path):
    from paged_core.adapters.triton_server import launcher

    backends = launcher.prepare_backends(tmp_path)
    python = backends / "python"
    assert {"libtriton_python.so", "triton_python_backend_utils.py",
            "triton_python_backend_stub"} <= {p.name for p in python.iterdir()}
    env = launcher.server_env({"PATH": "/usr/bin"})
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    assert "nvidia_pytriton.libs" in env["LD_LIBRARY_PATH"]
    cmd = launcher.server_command("/repo", backends, "127.0.0.1", 9000, 9001, 9002)
    assert "--http-port=9000" in cmd and "--grpc-port=9001" in cmd and "--metrics-port=9002" in cmd
    # Triton waits for in-flight requests as long as the engine drains (serve passes it)
    assert "--exit-timeout-secs=121" in launcher.server_command(
        "/repo", backends, "127.0.0.1", 9000, 9001, 9002, exit_timeout_s=120.5)


def test_litserve_probe_api_never_ships_the_engine_to_its_worker():
    from paged_core.adapters.litserve.server import EngineGateAPI
    from paged_core.openai import EngineHolder

    api = EngineGateAPI(EngineHolder())
    assert api.health() is False
    assert pickle.loads(pickle.dumps(api))._holder is None


def test_serve_rejects_unknown_adapter():
    with pytest.raises(ValueError, match="adapter"):
        serve("flask", "127.0.0.1", 8000, CONFIG)


def test_server_child_gets_the_config_and_keeps_process_wide_settings(monkeypatch):
    """Stale engine settings are replaced by the config's; process-wide ones (the CPU path,
    the model cache folder) reach the server unchanged."""
    from paged_core.adapters._process import child_env

    monkeypatch.setenv("PAGED_CORE_BLOCK_SIZE", "64")  # stale: the config says 32
    monkeypatch.setenv("PAGED_CORE_MAX_NUM_SEQS", "3")  # stale: the config leaves it default
    monkeypatch.setenv("PAGED_CORE_CPU_ISA", "avx2")
    monkeypatch.setenv("PAGED_CORE_CACHE_DIR", "/somewhere")
    env = child_env(EngineConfig(block_size=32))
    assert env["PAGED_CORE_BLOCK_SIZE"] == "32"
    assert env.get("PAGED_CORE_MAX_NUM_SEQS") == config_env(EngineConfig()).get("PAGED_CORE_MAX_NUM_SEQS")
    assert env["PAGED_CORE_CPU_ISA"] == "avx2" and env["PAGED_CORE_CACHE_DIR"] == "/somewhere"
