"""The front end's input processor: a prompt and params in, a validated, frozen
``EngineRequest`` out, with errors that say what to change and no engine state touched."""
import dataclasses

import pytest

from paged_core import BeamSearchParams, LLM, ParamValidationError, SamplingParams
from paged_core.requests.engine_io import EngineRequest
from paged_core.structured_outputs import StructuredOutputsParams


@pytest.fixture(scope="module")
def processor():
    return LLM(num_kv_blocks=8, block_size=16).engine.input_processor  # 128 tokens of KV


def test_sampling_and_beam_params_make_their_kind_of_request(processor):
    plain = processor.process("a", "Hello there", SamplingParams(max_tokens=3), priority=2,
                              tenant="t", deadline=123.0)
    assert type(plain) is EngineRequest and not plain.is_beam_search
    assert plain.prompt_token_ids == tuple(processor.tokenizer.encode("Hello there"))
    assert (plain.priority, plain.tenant, plain.deadline, plain.prompt) == (2, "t", 123.0,
                                                                           "Hello there")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plain.priority = 0
    beams = processor.process("b", [1, 2, 3], BeamSearchParams(beam_width=2, max_tokens=3))
    assert beams.is_beam_search and beams.prompt_token_ids == (1, 2, 3) and beams.prompt is None
    default = processor.process("c", "Hi")
    assert default.params == SamplingParams() and default.cache_salt is None


def test_a_prompt_dict_carries_its_cache_salt(processor):
    salted = processor.process("s", {"prompt": "Hi", "cache_salt": "tenant-a"})
    assert salted.cache_salt == "tenant-a" and salted.prompt == "Hi"
    for bad in ("", 7):
        with pytest.raises(ParamValidationError, match="cache_salt must be a non-empty string") as e:
            processor.process("s", {"prompt_token_ids": [1, 2], "cache_salt": bad})
        assert e.value.param == "cache_salt"
    # a salt is hashed as UTF-8 when the scheduler looks the prompt up: a lone surrogate
    # (from JSON's "\udfff") once stopped the whole engine there; now the request is refused
    with pytest.raises(ParamValidationError, match="cache_salt is not valid Unicode") as e:
        processor.process("s", {"prompt_token_ids": [1, 2], "cache_salt": "a\udfffb"})
    assert e.value.param == "cache_salt"


def test_a_grammar_is_compiled_before_the_request_exists(processor):
    choice = StructuredOutputsParams(choice=["yes", "no"])
    params = SamplingParams(max_tokens=4, structured_outputs=choice)
    request = processor.process("g", "Answer:", params)
    assert request.compiled_grammar is not None


def test_bad_inputs_say_what_to_change(processor):
    with pytest.raises(ValueError, match="must be a SamplingParams or BeamSearchParams, got dict"):
        processor.process("x", "Hi", {"max_tokens": 3})
    with pytest.raises(ValueError, match="prompt is too long: 200 tokens, but the KV cache"):
        processor.process("x", [5] * 200, SamplingParams(max_tokens=1))
