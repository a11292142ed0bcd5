"""``EngineConfig`` is made of typed parts that each check their own settings, under the
flat names users give; text settings convert by the field's type."""
from __future__ import annotations

import dataclasses

import pytest

from paged_core import LLM
from paged_core.config import (CacheConfig, EngineConfig, LoRAConfig, ModelConfig,
                               ParallelConfig, SchedulerConfig, ServingConfig)

PARTS = (ModelConfig, CacheConfig, SchedulerConfig, ParallelConfig, ServingConfig, LoRAConfig)


def test_every_flat_setting_belongs_to_exactly_one_part():
    owners: dict[str, list[str]] = {}
    for part in PARTS:
        for f in dataclasses.fields(part):
            owners.setdefault(f.name, []).append(part.__name__)
    assert all(len(names) == 1 for names in owners.values()), owners
    flat = {f.name for f in dataclasses.fields(EngineConfig)}
    assert flat == set(owners) | {"speculative_config", "kv_events_config"}
    assert [f.name for f in dataclasses.fields(EngineConfig)][0] == "model"


def test_an_engine_config_is_each_part_with_the_values_given():
    config = EngineConfig(max_num_seqs=7, block_size=32, tensor_parallel_size=1, drain_timeout=3.0)
    assert all(isinstance(config, part) for part in PARTS)
    assert config.max_num_seqs == 7 and config.block_size == 32 and config.drain_timeout == 3.0


@pytest.mark.parametrize("part, settings, message", [
    (SchedulerConfig, {"max_num_seqs": 0}, "max_num_seqs must be a positive integer"),
    (SchedulerConfig, {"scheduling_policy": "lifo"}, "scheduling_policy must be one of"),
    (CacheConfig, {"block_size": 12}, "block_size must be one of"),
    (CacheConfig, {"kv_cache_memory": "lots"}, "kv_cache_memory must be a byte count"),
    (ModelConfig, {"dtype": "int3"}, "dtype must be one of"),
    (ParallelConfig, {"tensor_parallel_size": -1}, "tensor_parallel_size must be a positive"),
    (ServingConfig, {"drain_timeout": -1.0}, "drain_timeout must be >= 0"),
    (LoRAConfig, {"max_loras": 0}, "max_loras must be a positive integer"),
    (LoRAConfig, {"max_loras": 4, "max_cpu_loras": 2},
     r"max_cpu_loras \(2\) must be at least max_loras \(4\)"),
])
def test_each_part_checks_its_own_settings_alone_and_inside_engine_config(part, settings, message):
    with pytest.raises(ValueError, match=message):
        part(**settings)
    with pytest.raises(ValueError, match=message):
        EngineConfig(**settings)
    with pytest.raises(ValueError, match=message):
        LLM(**settings)


def test_parts_normalise_their_values():
    assert CacheConfig(kv_cache_memory="2MiB").kv_cache_memory == 2 << 20
    assert EngineConfig(kv_cache_memory="1k").kv_cache_memory == 1000


@pytest.mark.parametrize("name, raw, value", [
    ("kv_cache_memory", "1048576", 1048576),  # int | str: an int when the text is one
    ("kv_cache_memory", "512MiB", 512 << 20),  # ... else the text, which the part parses
    ("itl_target_ms", "12.5", 12.5),
    ("enable_prefix_caching", "off", False),
    ("tenant_fairness", "YES", True),
    ("max_waiting_requests", "9", 9),
    ("served_model_name", "42", "42"),  # str stays text even when it reads as a number
    ("speculative_config", '{"method": "ngram", "num_speculative_tokens": 2}', None),
])
def test_text_settings_convert_by_field_type(name, raw, value):
    config = EngineConfig.from_env({f"PAGED_CORE_{name.upper()}": raw})
    if name == "speculative_config":
        assert config.speculative_config.num_speculative_tokens == 2
    else:
        assert getattr(config, name) == value and type(getattr(config, name)) is type(value)
    assert EngineConfig.from_strings({name: raw}) == config


@pytest.mark.parametrize("name, raw, expected", [
    ("max_num_seqs", "many", "must be an integer"),
    ("enable_prefix_caching", "maybe", "must be true or false"),
    ("itl_target_ms", "soon", "must be a number"),
])
def test_bad_text_names_the_setting_its_variable_and_the_type(name, raw, expected):
    with pytest.raises(ValueError, match=rf"setting {name} \(PAGED_CORE_{name.upper()}\) {expected}"):
        EngineConfig.from_strings({name: raw})
