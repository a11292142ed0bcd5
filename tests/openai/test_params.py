"""OpenAI request -> SamplingParams mapping, and engine errors -> the request field (no engine)."""
from __future__ import annotations

import pytest

from paged_core import ParamValidationError
from paged_core.openai.errors import OpenAIError, bad_request
from paged_core.openai.params import chat_params, completion_params
from paged_core.openai.protocol import ChatCompletionRequest, CompletionRequest

MSG = [{"role": "user", "content": "hi"}]


def test_completion_defaults_follow_openai():
    p = completion_params(CompletionRequest(prompt="x"))
    assert (p.max_tokens, p.temperature, p.top_p, p.n, p.logprobs) == (16, 1.0, 1.0, 1, None)


def test_completion_maps_openai_fields_and_vllm_extras():
    p = completion_params(CompletionRequest(
        prompt="x", max_tokens=5, temperature=0, top_p=0.5, n=2, stop=".", seed=3, logprobs=2,
        presence_penalty=0.5, frequency_penalty=-0.5, top_k=4, min_p=0.1,
        repetition_penalty=1.1, min_tokens=1, ignore_eos=True, stop_token_ids=[7]))
    assert (p.max_tokens, p.temperature, p.top_p, p.n, p.stop, p.seed, p.logprobs) == \
        (5, 0, 0.5, 2, ["."], 3, 2)
    assert (p.presence_penalty, p.frequency_penalty, p.top_k, p.min_p) == (0.5, -0.5, 4, 0.1)
    assert (p.repetition_penalty, p.min_tokens, p.ignore_eos, p.stop_token_ids) == \
        (1.1, 1, True, [7])


@pytest.mark.parametrize("fields,param", [
    ({"echo": True}, "echo"), ({"suffix": "s"}, "suffix"), ({"best_of": 3}, "best_of"),
    ({"logit_bias": {"one": 2.0}}, "logit_bias"), ({"logit_bias": {"-1": 2.0}}, "logit_bias"),
    ({"allowed_token_ids": []}, "allowed_token_ids"), ({"max_tokens": 0}, "max_tokens"),
    ({"top_p": 0}, "top_p"), ({"n": 0}, "n"), ({"logprobs": 21}, "logprobs"),
    ({"min_tokens": 9, "max_tokens": 2}, "min_tokens"),
])
def test_completion_rejections_name_the_field(fields, param):
    with pytest.raises(OpenAIError) as info:
        completion_params(CompletionRequest(prompt="x", **fields))
    assert (info.value.status, info.value.param) == (400, param)


def test_logit_bias_keys_become_token_ids_and_biases_are_clamped_as_vllm_does():
    """OpenAI sends token ids as JSON keys (strings) and allows biases in [-100, 100]; vLLM
    clamps a bias outside that range rather than refusing it."""
    p = completion_params(CompletionRequest(prompt="x", logit_bias={"7": 5.5, "12": -250},
                                            allowed_token_ids=[7, 12, 30]))
    assert p.logit_bias == {7: 5.5, 12: -100.0}
    assert p.allowed_token_ids == [7, 12, 30]
    assert chat_params(ChatCompletionRequest(messages=MSG, bad_words=["no"])).bad_words == ["no"]
    chat = chat_params(ChatCompletionRequest(messages=MSG, logit_bias={"3": 150}))
    assert chat.logit_bias == {3: 100.0}
    assert completion_params(CompletionRequest(prompt="x", logit_bias={})).logit_bias is None


def test_beam_search_refuses_logit_edits():
    for fields, param in (({"logit_bias": {"1": 2.0}}, "logit_bias"),
                          ({"allowed_token_ids": [1, 2]}, "allowed_token_ids"),
                          ({"bad_words": ["no"]}, "bad_words"),
                          ({"truncate_prompt_tokens": 5}, "truncate_prompt_tokens")):
        with pytest.raises(OpenAIError) as info:
            completion_params(CompletionRequest(prompt="x", n=2, use_beam_search=True,
                                                **fields))
        assert (info.value.status, info.value.param) == (400, param)


def test_chat_max_completion_tokens_wins_and_errors_use_its_name():
    assert chat_params(ChatCompletionRequest(messages=MSG, max_tokens=3,
                                             max_completion_tokens=5)).max_tokens == 5
    assert chat_params(ChatCompletionRequest(messages=MSG)).max_tokens is None
    with pytest.raises(OpenAIError) as info:
        chat_params(ChatCompletionRequest(messages=MSG, max_completion_tokens=0))
    assert info.value.param == "max_completion_tokens"


def test_chat_logprobs_flag_and_top_logprobs_count():
    assert chat_params(ChatCompletionRequest(messages=MSG)).logprobs is None
    assert chat_params(ChatCompletionRequest(messages=MSG, logprobs=True)).logprobs == 0
    assert chat_params(ChatCompletionRequest(messages=MSG, logprobs=True,
                                             top_logprobs=3)).logprobs == 3
    for fields, param in (({"top_logprobs": 2}, "top_logprobs"),
                          ({"logprobs": True, "top_logprobs": 99}, "top_logprobs"),
                          ({"tools": [{"type": "function"}]}, "tools"),
                          ({"response_format": {"type": "json_schema"}}, "response_format")):
        with pytest.raises(OpenAIError) as info:
            chat_params(ChatCompletionRequest(messages=MSG, **fields))
        assert info.value.param == param


def test_bad_request_names_the_errors_own_param():
    """The 400's ``param`` is the typed error's field, renamed to the request's, never read
    off the message; a plain ``ValueError`` (or the prompt's, ``param=None``) gets the
    default."""
    err = bad_request(ParamValidationError("min_tokens must be <= max_tokens, got 3 and 2",
                                           "min_tokens"))
    assert err.param == "min_tokens" and err.status == 400
    renamed = bad_request(ParamValidationError("max_tokens is too large", "max_tokens"),
                          rename={"max_tokens": "max_completion_tokens"})
    assert renamed.param == "max_completion_tokens"
    assert bad_request(ValueError("max_tokens ..."), default_param="prompt").param == "prompt"
    assert bad_request(ParamValidationError("prompt is empty"), default_param="messages"
                       ).param == "messages"
