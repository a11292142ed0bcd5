"""``truncate_prompt_tokens`` (vLLM's ``SamplingParams`` field): a request keeps only its
prompt's last ``k`` tokens (-1: the last ``max_model_len``), before every length check, so a
prompt too long for the context can still be served from its end."""
import pytest

from paged_core import LLM, ParamValidationError, SamplingParams

from ..reference import passage_token_ids


@pytest.fixture(scope="module")
def processor():
    return LLM(num_kv_blocks=8, block_size=16).engine.input_processor  # 128 tokens of KV


def test_the_prompt_keeps_its_last_tokens_before_the_length_checks(processor):
    long = list(range(1, 401))  # far more than the 128 tokens of KV
    with pytest.raises(ValueError, match="prompt is too long"):
        processor.process("a", long, SamplingParams(max_tokens=3))
    request = processor.process("b", long, SamplingParams(max_tokens=3, truncate_prompt_tokens=50))
    assert request.prompt_token_ids == tuple(range(351, 401))
    words = "one two three four five six"
    text = processor.process("c", words, SamplingParams(truncate_prompt_tokens=2))
    assert text.prompt_token_ids == tuple(processor.tokenizer.encode(words)[-2:])
    assert text.prompt == words  # the text the client sent
    short = processor.process("d", [5, 6, 7], SamplingParams(truncate_prompt_tokens=-1))
    assert short.prompt_token_ids == (5, 6, 7)  # -1 keeps up to max_model_len (8192)
    with pytest.raises(ValueError, match="prompt is too long"):  # 8192 tokens leave no room
        processor.process("e", list(range(1, 9001)), SamplingParams(truncate_prompt_tokens=-1))


@pytest.mark.parametrize("value,message", [
    (0, "truncate_prompt_tokens must be >= 1, or -1"),
    (-2, "truncate_prompt_tokens must be >= -1"),
    ("8", "truncate_prompt_tokens must be an integer"),
])
def test_invalid_values_name_the_field(value, message):
    with pytest.raises(ParamValidationError, match=message) as info:
        SamplingParams(truncate_prompt_tokens=value)
    assert info.value.param == "truncate_prompt_tokens"


def test_more_than_the_context_is_refused(processor):
    with pytest.raises(ParamValidationError, match="more than the model's context") as info:
        processor.process("f", [1, 2, 3], SamplingParams(truncate_prompt_tokens=8193))
    assert info.value.param == "truncate_prompt_tokens"


def test_output_is_that_of_the_prompts_end_alone(llm_fp32, tokenizer):
    prompt = passage_token_ids(tokenizer, 60, offset=3)
    greedy = dict(temperature=0, max_tokens=12, ignore_eos=True)
    (cut,) = llm_fp32.generate([{"prompt_token_ids": prompt}],
                               SamplingParams(truncate_prompt_tokens=20, **greedy), use_tqdm=False)
    (tail,) = llm_fp32.generate([{"prompt_token_ids": prompt[-20:]}], SamplingParams(**greedy),
                                use_tqdm=False)
    assert cut.prompt_token_ids == prompt[-20:]
    assert cut.outputs[0].token_ids == tail.outputs[0].token_ids
