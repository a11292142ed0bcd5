"""``logit_bias``, ``allowed_token_ids`` and ``bad_words`` (vLLM's ``SamplingParams``
fields): checked at construction and against the model, applied to every sampled token.
Greedy output equals transformers' ``generate()`` with the same edit of the logits, token for
token in float32; sampled tokens stay inside the allowed set and never take a token biased
by -100."""
import json

import pytest
import torch

from paged_core import SamplingParams

from ..reference import passage_token_ids

MAX_TOKENS = 24


def engine_tokens(llm, prompt: list[int], **edits) -> list[int]:
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, **edits)
    (out,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    return out.outputs[0].token_ids


def transformers_tokens(model, prompt: list[int], edit, with_ids: bool = False) -> list[int]:
    """transformers' greedy continuation with ``edit(scores)`` (``with_ids``:
    ``edit(input_ids, scores)``) applied at every step."""
    from transformers import LogitsProcessorList

    def processor(input_ids, scores):
        return edit(input_ids, scores) if with_ids else edit(scores)

    ids = torch.tensor([prompt])
    return model.generate(
        ids, attention_mask=torch.ones_like(ids), eos_token_id=[], max_new_tokens=MAX_TOKENS,
        do_sample=False, pad_token_id=0, logits_processor=LogitsProcessorList([processor]),
    )[0, len(prompt):].tolist()


def test_logit_bias_greedy_matches_transformers(llm_fp32, hf_embedded, tokenizer):
    prompt = passage_token_ids(tokenizer, 30, offset=5)
    plain = engine_tokens(llm_fp32, prompt)
    # ban the first greedy token, lean against a later one, lean towards one never chosen
    unchosen = next(t for t in range(400, 500) if t not in plain)
    bias = {plain[0]: -100.0, plain[6]: -1.5, unchosen: 2.5}

    def add_bias(scores):
        scores = scores.clone()
        for token, value in bias.items():
            scores[:, token] += value
        return scores

    tokens = engine_tokens(llm_fp32, prompt, logit_bias=bias)
    assert tokens == transformers_tokens(hf_embedded, prompt, add_bias)
    assert tokens[0] != plain[0]


def test_allowed_token_ids_greedy_matches_transformers(llm_fp32, hf_embedded, tokenizer):
    prompt = passage_token_ids(tokenizer, 30, offset=40)
    plain = engine_tokens(llm_fp32, prompt)
    allowed = sorted((set(plain[3:12]) | set(range(300, 340))) - {plain[0]})

    def keep_allowed(scores):
        mask = torch.full_like(scores, float("-inf"))
        mask[:, allowed] = 0
        return scores + mask

    tokens = engine_tokens(llm_fp32, prompt, allowed_token_ids=allowed)
    assert tokens == transformers_tokens(hf_embedded, prompt, keep_allowed)
    assert set(tokens) <= set(allowed) and tokens[0] != plain[0]


def test_both_edits_together_and_beside_plain_rows_in_one_batch(llm_fp32, tokenizer):
    """A batch mixing edited and plain rows: each row's tokens are what it gets alone."""
    prompts = [passage_token_ids(tokenizer, 20, offset=o) for o in (0, 15, 60)]
    alone = [engine_tokens(llm_fp32, prompts[0]),
             engine_tokens(llm_fp32, prompts[1], logit_bias={7: 4.0, 12: -3.0}),
             engine_tokens(llm_fp32, prompts[2], allowed_token_ids=list(range(200, 260)),
                           logit_bias={201: 1.0})]
    params = [SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, **edits)
              for edits in ({}, {"logit_bias": {7: 4.0, 12: -3.0}},
                            {"allowed_token_ids": list(range(200, 260)), "logit_bias": {201: 1.0}})]
    outs = llm_fp32.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == alone
    assert set(alone[2]) <= set(range(200, 260))


def test_sampled_tokens_keep_to_the_allowed_set_and_avoid_banned_ones(llm_fp32, tokenizer):
    prompt = passage_token_ids(tokenizer, 25, offset=9)
    allowed = list(range(1000, 1300))
    params = SamplingParams(temperature=1.3, top_p=0.95, seed=11, n=3, max_tokens=30,
                            ignore_eos=True, allowed_token_ids=allowed)
    (out,) = llm_fp32.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    assert all(set(sample.token_ids) <= set(allowed) for sample in out.outputs)
    # the tokens a hot sampler picks most without a bias, banned by -100
    free = SamplingParams(temperature=1.3, seed=11, n=3, max_tokens=30, ignore_eos=True)
    (unbiased,) = llm_fp32.generate([{"prompt_token_ids": prompt}], free, use_tqdm=False)
    banned = {t for sample in unbiased.outputs for t in sample.token_ids}
    params = SamplingParams(temperature=1.3, seed=11, n=3, max_tokens=30, ignore_eos=True,
                            logit_bias={t: -100.0 for t in banned})
    (out,) = llm_fp32.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    assert not any(set(sample.token_ids) & banned for sample in out.outputs)


@pytest.mark.parametrize("field,value,message", [
    ("logit_bias", {"x": 1.0}, "logit_bias keys must be token ids"),
    ("logit_bias", {"\u00b2": 1.0}, "logit_bias keys must be token ids"),  # a digit, not decimal
    ("logit_bias", {"9" * 5000: 1.0}, "logit_bias keys must be token ids"),
    ("logit_bias", {-3: 1.0}, "logit_bias keys must be token ids"),
    ("logit_bias", {1: float("inf")}, "logit_bias must be a finite number"),
    ("logit_bias", {1: "high"}, "logit_bias must be a number"),
    ("logit_bias", [1, 2], "logit_bias must be a mapping of token ids to biases"),
    ("allowed_token_ids", [], "allowed_token_ids must name at least one token"),
    ("allowed_token_ids", [3, -1], "allowed_token_ids must be >= 0"),
    ("allowed_token_ids", 5, "allowed_token_ids must be a list"),
])
def test_invalid_edits_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message) as info:
        SamplingParams(**{field: value})
    assert info.value.param == field


def test_json_keys_are_token_ids_and_ids_are_checked_against_the_vocabulary():
    params = SamplingParams.from_dict(json.loads('{"logit_bias": {"12": -5, "40": 2.5}}'))
    assert params.logit_bias == {12: -5.0, 40: 2.5}
    assert SamplingParams(logit_bias={}).logit_bias is None
    for values, field in (({"logit_bias": {100: 1.0}}, "logit_bias"),
                          ({"allowed_token_ids": [5, 100]}, "allowed_token_ids")):
        with pytest.raises(ValueError, match=rf"{field} must be token ids in \[0, 100\)") as info:
            SamplingParams(**values).verify_for_model(vocab_size=100, max_model_len=50,
                                                      num_prompt_tokens=10)
        assert info.value.param == field
    SamplingParams(logit_bias={99: 1.0}, allowed_token_ids=[0, 99]).verify_for_model(100, 50, 10)


def test_an_out_of_vocabulary_edit_is_refused_and_the_engine_keeps_serving(llm_fp32, tokenizer):
    prompt = passage_token_ids(tokenizer, 12)
    vocab = llm_fp32.engine.input_processor.vocab_size
    with pytest.raises(ValueError, match="logit_bias must be token ids") as info:
        engine_tokens(llm_fp32, prompt, logit_bias={vocab: 1.0})
    assert info.value.param == "logit_bias"
    assert len(engine_tokens(llm_fp32, prompt, logit_bias={5: 1.0})) == MAX_TOKENS
    assert llm_fp32.stats()["kv_blocks_used"] == 0


def test_bad_words_are_spelled_as_vllm_spells_them(tokenizer):
    """A word's spellings: at the start of a text and, where different and as long, after a
    space; a spelling is banned once its other tokens end the output."""
    from paged_core.sample.bad_words import bad_words_token_ids, banned_tokens

    def ids(text):
        return tuple(tokenizer.encode(text, add_special_tokens=False))

    spellings = bad_words_token_ids(["Paris", "  big city"], tokenizer, len(tokenizer))
    assert spellings[0] == ids("Paris") and ids(" Paris") in spellings
    assert ids("big city") in spellings and ids(" big city") in spellings
    assert banned_tokens(((5,), (7, 8, 9)), []) == [5]
    assert banned_tokens(((5,), (7, 8, 9)), [1, 7, 8]) == [5, 9]
    assert banned_tokens(((7, 8, 9),), [8]) == []  # too short to hold the first two
    assert banned_tokens(((7, 8, 9), (3, 9)), [7, 8, 3]) == [9]
    assert banned_tokens(((7, 8, 9), (3, 9)), [7, 8]) == [9]


def test_bad_words_greedy_matches_transformers(llm_fp32, hf_embedded, tokenizer):
    """The oracle bans, from the generated tokens only (vLLM's rule), the last token of each
    spelling whose other tokens end them."""
    from paged_core.sample.bad_words import bad_words_token_ids

    prompt = passage_token_ids(tokenizer, 30, offset=70)
    plain = engine_tokens(llm_fp32, prompt)
    words = [tokenizer.decode(plain[2:3]).strip(), tokenizer.decode(plain[8:11]).strip()]
    spellings = bad_words_token_ids(words, tokenizer, hf_embedded.config.vocab_size)
    assert any(len(s) > 1 for s in spellings)

    def ban(input_ids, scores):
        output = input_ids[0, len(prompt):].tolist()
        scores = scores.clone()
        for spelling in spellings:
            before = list(spelling[:-1])
            if len(before) <= len(output) and output[len(output) - len(before):] == before:
                scores[:, spelling[-1]] = float("-inf")
        return scores

    tokens = engine_tokens(llm_fp32, prompt, bad_words=words)
    assert tokens == transformers_tokens(hf_embedded, prompt, ban, with_ids=True)
    assert tokens != plain


@pytest.mark.parametrize("value,message", [
    ([""], "bad_words must hold words"), (["ok", "   "], "bad_words must hold words"),
    (["ok", 3], "bad_words must hold words"), ("word", "bad_words must be a list"),
    (["a\udfffb"], "bad_words is not valid Unicode"),
])
def test_invalid_bad_words_name_the_field(value, message):
    with pytest.raises(ValueError, match=message) as info:
        SamplingParams(bad_words=value)
    assert info.value.param == "bad_words"
