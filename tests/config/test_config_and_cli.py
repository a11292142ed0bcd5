"""EngineConfig validation, environment variables, and the paged-core CLI."""
import json
import os
import subprocess
import sys

import pytest

from paged_core import EngineConfig
from paged_core.config import parse_size


def test_sizes_parse():
    assert parse_size("1GiB") == 2**30
    assert parse_size("512MiB") == 512 * 2**20
    assert parse_size("2GB") == 2 * 10**9
    assert parse_size(4096) == 4096
    with pytest.raises(ValueError, match="kv_cache_memory must be a byte count"):
        parse_size("lots")


@pytest.mark.parametrize("kwargs,message", [
    ({"block_size": 7}, "block_size must be one of"),
    ({"dtype": "float64"}, "dtype must be one of"),
    ({"max_num_seqs": 0}, "max_num_seqs must be a positive integer"),
    ({"model": "/no/such/model"}, "does not exist"),
    ({"attention_backend": "cuda"}, "attention_backend must be one of"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization must be in"),
])
def test_bad_settings_fail_with_a_clear_message(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**kwargs)


def test_from_env_reads_prefixed_variables_and_overrides_win():
    env = {"PAGED_CORE_BLOCK_SIZE": "32", "PAGED_CORE_ENABLE_PREFIX_CACHING": "false",
           "PAGED_CORE_KV_CACHE_MEMORY": "64MiB", "PAGED_CORE_MAX_NUM_SEQS": "8"}
    config = EngineConfig.from_env(env, max_num_seqs=4)
    assert config.block_size == 32 and config.enable_prefix_caching is False
    assert config.kv_cache_memory == 64 * 2**20 and config.max_num_seqs == 4
    with pytest.raises(ValueError, match="PAGED_CORE_BLOCK_SIZE"):
        EngineConfig.from_env({"PAGED_CORE_BLOCK_SIZE": "big"})


def _cli(*args, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "paged_core.cli", *args], capture_output=True,
                          text=True, env=env, timeout=300)


def test_cli_generate_matches_llm(llm_fp32):
    from paged_core import SamplingParams
    result = _cli("generate", "The capital of France is", "--max-tokens", "8", "--dtype", "float32",
                  "--json")
    assert result.returncode == 0, result.stderr
    line = json.loads(result.stdout.strip().splitlines()[-1])
    expected = llm_fp32.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=8),
                                 use_tqdm=False)[0].outputs[0]
    assert line["token_ids"] == expected.token_ids and line["text"] == expected.text


def test_true_or_false_engine_flags_also_stand_alone():
    from paged_core.cli import build_parser, engine_config

    args = build_parser().parse_args(["generate", "x", "--enforce-eager", "--async-scheduling",
                                      "--enable-prefix-caching", "false", "--max-num-seqs", "4"])
    config = engine_config(args)
    assert config.enforce_eager is True and config.async_scheduling is True
    assert config.enable_prefix_caching is False and config.max_num_seqs == 4
    with pytest.raises(SystemExit):  # other fields still need their value
        build_parser().parse_args(["generate", "x", "--max-num-seqs"])


def test_cli_reports_bad_settings():
    result = _cli("generate", "x", "--block-size", "7")
    assert result.returncode == 2
    assert "block_size must be one of 8, 16, 32, 64, 128, got 7" in result.stderr
