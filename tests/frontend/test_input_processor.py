"""The front end's input processor: a prompt and params in, a validated request out, with
errors that say what to change and no engine state touched."""
import pytest

from paged_core import BeamSearchParams, LLM, SamplingParams
from paged_core.beam_search.request import BeamSearchRequest
from paged_core.request import Request
from paged_core.structured_outputs import StructuredOutputsParams


@pytest.fixture(scope="module")
def processor():
    return LLM(num_kv_blocks=8, block_size=16).engine.input_processor  # 128 tokens of KV


def test_sampling_and_beam_params_make_their_kind_of_request(processor):
    plain = processor.process("a", "Hello there", SamplingParams(max_tokens=3), priority=2, tenant="t")
    assert type(plain) is Request and plain.prompt_token_ids and plain.priority == 2
    assert plain.tenant == "t"
    beams = processor.process("b", [1, 2, 3], BeamSearchParams(beam_width=2, max_tokens=3))
    assert type(beams) is BeamSearchRequest and beams.prompt_token_ids == [1, 2, 3]
    default = processor.process("c", "Hi")
    assert type(default) is Request and default.params == SamplingParams()


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
