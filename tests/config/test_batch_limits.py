"""Step limits left unset take vLLM's defaults for the device and the usage (``batch_limits``):
wide steps on large GPUs, the CPU's own, and every engine reports the limits it resolved."""
import pytest

from paged_core import LLM, AsyncEngine, EngineConfig
from paged_core.config import batch_limits
from paged_core.engine import llm_engine

GIB = 1 << 30


def test_large_gpus_take_wide_steps_a100s_and_small_ones_narrower_the_cpu_its_own():
    assert batch_limits("cuda", 141 * GIB, "NVIDIA H200", "llm") == (1024, 16384)
    assert batch_limits("cuda", 80 * GIB, "NVIDIA H100 80GB HBM3", "server") == (1024, 8192)
    assert batch_limits("cuda", 80 * GIB, "NVIDIA A100-SXM4-80GB", "llm") == (256, 8192)
    assert batch_limits("cuda", 24 * GIB, "NVIDIA L4", "server") == (256, 2048)
    assert batch_limits("cpu", 0, "", "llm") == batch_limits("cpu", 0, "", "server") == (128, 2048)


def test_unset_limits_stay_none_until_an_engine_resolves_them_and_bad_ones_are_refused():
    config = EngineConfig()
    assert config.max_num_seqs is None and config.max_num_batched_tokens is None
    assert EngineConfig.from_env({"PAGED_CORE_MAX_NUM_SEQS": "1024"}).max_num_seqs == 1024
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="max_num_seqs must be a positive integer"):
            EngineConfig(max_num_seqs=bad)
    with pytest.raises(ValueError, match="max_num_batched_tokens must be a positive integer"):
        EngineConfig(max_num_batched_tokens=0)


def test_an_offline_engine_fills_the_unset_limit_and_keeps_the_set_one():
    llm = LLM(dtype="float32", num_kv_blocks=64, max_num_batched_tokens=512)
    try:
        config, scheduler = llm.engine.config, llm.engine.core.scheduler
        assert (config.max_num_seqs, config.max_num_batched_tokens) == (128, 512)
        assert (scheduler.max_num_seqs, scheduler.max_num_batched_tokens) == (128, 512)
    finally:
        llm.shutdown()


def test_a_server_asks_for_the_servers_defaults_and_reports_them(monkeypatch):
    asked = []

    def recording(*args):
        asked.append(args[-1])
        return batch_limits(*args)

    monkeypatch.setattr(llm_engine, "batch_limits", recording)
    engine = AsyncEngine(EngineConfig(dtype="float32", num_kv_blocks=64))
    try:
        assert asked == ["server"]
        assert (engine.config.max_num_seqs, engine.config.max_num_batched_tokens) == (128, 2048)
        assert engine.config is engine.engine.config
    finally:
        engine.shutdown_sync()
