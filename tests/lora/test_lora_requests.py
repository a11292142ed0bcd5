"""LoRA requests that cannot be served are refused at once, naming ``lora_request`` and what
to change; adapters are registered, listed and removed (vLLM's ``add_lora`` /
``remove_lora`` / ``list_loras``); the slot table keeps adapters in use resident."""
import json
import os

import pytest

from paged_core import LLM, LoRARequest, ParamValidationError, SamplingParams
from paged_core.core.lora_slots import LoRASlotTable

from ..tiny_models import build_tiny_model
from .adapters import make_adapter


@pytest.fixture(scope="module")
def base(tokenizer, tmp_path_factory):
    return build_tiny_model("llama", str(tmp_path_factory.mktemp("lora-req") / "llama"),
                            tokenizer)


@pytest.fixture(scope="module")
def adapter(base, tmp_path_factory):
    return make_adapter(base, str(tmp_path_factory.mktemp("lora-req") / "r8"), 8, seed=1)


@pytest.fixture(scope="module")
def llm(base):
    return LLM(model=base, dtype="float32", num_kv_blocks=32, enable_lora=True, max_loras=2,
               max_lora_rank=8)


def test_an_engine_without_enable_lora_refuses_adapters(base, adapter):
    plain = LLM(model=base, dtype="float32", num_kv_blocks=16)
    with pytest.raises(ParamValidationError, match="enable_lora=True") as err:
        plain.generate(["hi"], SamplingParams(max_tokens=2), use_tqdm=False,
                       lora_request=LoRARequest("a", 1, adapter))
    assert err.value.param == "lora_request"


def test_bad_requests_name_lora_request(llm, adapter, tmp_path, tokenizer):
    with pytest.raises(ParamValidationError, match="lora_int_id must be an integer >= 1"):
        LoRARequest("a", 0, adapter)
    with pytest.raises(ParamValidationError, match="is not a folder"):
        LoRARequest("a", 1, str(tmp_path / "missing"))
    with pytest.raises(ParamValidationError, match="no adapter_config.json"):
        llm.add_lora(LoRARequest("empty", 9, str(tmp_path)))
    big = make_adapter(llm.engine.config.model, str(tmp_path / "r16"), 16, seed=2)
    with pytest.raises(ParamValidationError, match="rank 16 exceeds max_lora_rank=8"):
        llm.add_lora(LoRARequest("big", 10, big))
    other = build_tiny_model("llama", str(tmp_path / "wider"), tokenizer, hidden_size=96,
                             head_dim=24)
    wrong = make_adapter(other, str(tmp_path / "wrong"), 4, seed=3)
    with pytest.raises(ParamValidationError, match="do not fit the base model") as err:
        llm.generate(["hi"], use_tqdm=False, lora_request=LoRARequest("wrong", 11, wrong))
    assert err.value.param == "lora_request"


def test_unsupported_adapter_options_are_refused(llm, adapter, tmp_path):
    import shutil

    dora = str(tmp_path / "dora")
    shutil.copytree(adapter, dora)
    path = os.path.join(dora, "adapter_config.json")
    with open(path) as f:
        config = json.load(f)
    with open(path, "w") as f:
        json.dump({**config, "use_dora": True}, f)
    with pytest.raises(ParamValidationError, match="use_dora=True is not supported"):
        llm.add_lora(LoRARequest("dora", 12, dora))


def test_add_list_and_remove(llm, adapter, tmp_path):
    request = LoRARequest("a", 3, adapter)
    assert llm.add_lora(request) is True
    assert llm.add_lora(request) is False  # already there
    assert 3 in llm.list_loras()
    with pytest.raises(ParamValidationError, match="lora_int_id 3 is already adapter 'a'"):
        llm.add_lora(LoRARequest("b", 3, adapter))
    out = llm.generate(["hello there"], SamplingParams(max_tokens=3, temperature=0),
                       use_tqdm=False, lora_request=request)
    assert len(out[0].outputs[0].token_ids) == 3
    assert llm.remove_lora(3) is True and 3 not in llm.list_loras()
    assert llm.remove_lora(3) is False


def test_slot_table_never_evicts_an_adapter_in_use():
    table = LoRASlotTable(max_loras=2)
    assert table.admit(None, set) and table.take_loads() == []
    assert table.admit(1, set) and table.admit(2, lambda: {1})
    assert table.take_loads() == [(0, 1), (1, 2)]
    assert not table.admit(3, lambda: {1, 2})  # both in use: 3 waits
    assert table.admit(3, lambda: {2})  # 1 is idle: its slot goes to 3
    assert table.take_loads() == [(0, 3)] and table.slot(3) == 0 and table.slot(2) == 1
    assert table.admit(2, lambda: {3}) and table.take_loads() == []  # resident: nothing to load
    table.release(3)
    assert table.admit(4, lambda: {2}) and table.take_loads() == [(0, 4)]


def test_lora_modules_setting_parses_vllm_forms():
    from paged_core import EngineConfig
    from paged_core.lora.modules import parse_lora_modules

    assert parse_lora_modules("sql=/a/sql, math=/a/math") == [("sql", "/a/sql"),
                                                               ("math", "/a/math")]
    assert parse_lora_modules('[{"name": "sql", "path": "/a/sql"}]') == [("sql", "/a/sql")]
    for bad, message in (("sql", "not name=path"), ("a=/x a=/y", "unique"),
                         ('[{"name": "a"}]', "JSON list")):
        with pytest.raises(ValueError, match=message):
            parse_lora_modules(bad)
    with pytest.raises(ValueError, match="need enable_lora=True"):
        EngineConfig(lora_modules="sql=/a/sql")
