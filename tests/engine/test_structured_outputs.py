"""Structured outputs on the embedded model: every output parses and validates, regex and
choice outputs match, the mask never removes a token the grammar allows, bad constraints
are ``ValueError`` naming the field, and preemption / ``n > 1`` keep the grammar state."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch
import xgrammar as xgr

from paged_core import LLM, SamplingParams, StructuredOutputsParams
from paged_core.structured_outputs import GrammarBitmask, SequenceGrammar

from ..tiny_models import build_tiny_model

SHORT = {"type": "string", "maxLength": 12}
POINT = {"type": "object", "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9},
                                          "y": {"type": "integer", "minimum": -9, "maximum": 9}},
         "required": ["x", "y"]}
SCHEMAS = [
    {"type": "object", "properties": {"name": SHORT, "age": {"type": "integer", "minimum": 0,
                                                             "maximum": 120}},
     "required": ["name", "age"]},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 999}, "email": SHORT},
        "required": ["id", "email"]}, "active": {"type": "boolean"}},
     "required": ["user", "active"]},
    {"type": "object", "properties": {"scores": {"type": "array", "items": {
        "type": "integer", "minimum": 0, "maximum": 100}, "minItems": 1, "maxItems": 4}},
     "required": ["scores"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                      "shade": {"enum": ["light", "dark"]}},
     "required": ["color", "shade"]},
    {"type": "object", "properties": {"celsius": {"type": "number", "minimum": -50,
                                                  "maximum": 50},
                                      "unit": {"const": "C"}}, "required": ["celsius", "unit"]},
    {"$defs": {"point": POINT}, "type": "object",
     "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
     "required": ["start", "end"]},
    {"type": "object", "properties": {"items": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"name": SHORT, "qty": {"type": "integer", "minimum": 1,
                                                                 "maximum": 9}},
        "required": ["name", "qty"]}}}, "required": ["items"]},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"},
                                      "ok": {"type": "boolean"}}, "required": ["code", "ok"]},
    {"type": "object", "properties": {"value": {"anyOf": [
        {"type": "integer", "minimum": 0, "maximum": 99}, SHORT]}}, "required": ["value"]},
    {"type": "object", "properties": {"title": SHORT, "subtitle": {"type": ["string", "null"],
                                                                    "maxLength": 8}},
     "required": ["title", "subtitle"]},
    {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 2, "maxItems": 3},
]
SAMPLES_PER_SCHEMA = 5


def _chat(llm: LLM, text: str) -> dict:
    return {"prompt_token_ids": llm.get_tokenizer().apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True,
        return_dict=False)}


def test_sampled_outputs_validate_against_their_schemas(llm_fp32):
    prompts, params = [], []
    for i, schema in enumerate(SCHEMAS):
        prompts.append(_chat(llm_fp32, f"Reply in JSON with {', '.join(schema.get('required', ['a list']))}."))
        so = StructuredOutputsParams(json=schema if i % 2 else json.dumps(schema),
                                     disable_any_whitespace=i % 4 != 0)
        params.append(SamplingParams(n=SAMPLES_PER_SCHEMA, temperature=0.5, seed=i,
                                     max_tokens=100, structured_outputs=so))
    outs = llm_fp32.generate(prompts, params, use_tqdm=False)
    checked = 0
    for schema, out in zip(SCHEMAS, outs):
        for comp in out.outputs:
            assert comp.finish_reason == "stop", (schema, comp.text)
            jsonschema.validate(json.loads(comp.text), schema)
            checked += 1
    assert checked == len(SCHEMAS) * SAMPLES_PER_SCHEMA >= 50
    assert llm_fp32.stats()["kv_blocks_used"] == 0


def test_regex_and_choice_outputs_match(llm_fp32):
    phone, date = r"\(\d{3}\) \d{3}-\d{4}", r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]"
    choices = ["positive", "negative", "neutral"]
    params = [SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=30, structured_outputs=s)
              for s in (StructuredOutputsParams(regex=phone), StructuredOutputsParams(regex=date),
                        StructuredOutputsParams(choice=choices))]
    prompts = [_chat(llm_fp32, q) for q in ("Call me at", "When is it?", "I love this movie!")]
    outs = llm_fp32.generate(prompts, params, use_tqdm=False)
    for pattern, out in zip((phone, date), outs):
        for comp in out.outputs:
            assert re.fullmatch(pattern, comp.text) and comp.finish_reason == "stop", comp.text
    assert {c.text for c in outs[2].outputs} <= set(choices)


def test_greedy_constrained_equals_unconstrained_where_the_grammar_allows_it(llm_fp32):
    """A grammar accepting exactly the unconstrained greedy text, or any text at all, must
    leave every greedy token in place: the mask only removes tokens the grammar forbids."""
    prompts = [_chat(llm_fp32, "Name three primary colors.")]
    free = llm_fp32.generate(prompts, SamplingParams(temperature=0, max_tokens=16),
                             use_tqdm=False)
    for prompt, ref in zip(prompts, free):
        ref = ref.outputs[0]
        for so in (StructuredOutputsParams(choice=[ref.text]),
                   StructuredOutputsParams(regex=r"[\s\S]*")):
            got = llm_fp32.generate(prompt, SamplingParams(
                temperature=0, max_tokens=16, structured_outputs=so), use_tqdm=False)[0].outputs[0]
            assert got.token_ids[:len(ref.token_ids)] == ref.token_ids, so
            assert got.text == ref.text


def test_bitmask_keeps_exactly_the_tokens_the_matcher_accepts(llm_fp32):
    engine = llm_fp32.engine
    so = StructuredOutputsParams(json={"type": "object", "properties": {"ok": {"type": "boolean"}},
                                       "required": ["ok"]})
    compiled = engine.input_processor.grammar_compiler.compile(so)
    grammar = SequenceGrammar(xgr.GrammarMatcher(compiled))
    tokenizer = engine.tokenizer
    for token in tokenizer.encode('{"ok', add_special_tokens=False):
        assert grammar.accept(token) is False
    logits = torch.randn(3, engine.input_processor.vocab_size)
    before = logits.clone()
    GrammarBitmask()(logits, [None, grammar, None])
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    kept = torch.isfinite(logits[1]).nonzero()[:, 0].tolist()
    accepted = []
    for token in range(engine.input_processor.vocab_size):  # the oracle: the matcher itself, token by token
        if grammar.matcher.accept_token(token):
            accepted.append(token)
            grammar.matcher.rollback(1)
    assert kept == accepted and len(kept) >= 2  # at least '"' and '":'
    assert torch.equal(logits[1, kept], before[1, kept])
    assert not set(engine.input_processor.eos_token_ids) & set(kept)  # EOS only where the grammar is complete


def test_preempted_and_forked_sequences_keep_their_grammar_state(tokenizer, tmp_path):
    """A random tiny model (its tokens follow the grammar only because of the mask) with a
    KV cache of 160 tokens for 6 sequences: they are preempted and recomputed."""
    folder = build_tiny_model("llama", str(tmp_path / "llama"), tokenizer)
    llm = LLM(folder, dtype="float32", num_kv_blocks=10, max_model_len=512,
              enable_prefix_caching=False)
    schema = {**SCHEMAS[6], "properties": {"items": {**SCHEMAS[6]["properties"]["items"],
                                                     "minItems": 2}}}
    prompt = _chat(llm, "List what to buy as JSON.")
    outs = llm.generate([prompt] * 3, SamplingParams(
        n=2, temperature=0.9, seed=3, max_tokens=60,
        structured_outputs=StructuredOutputsParams(json=schema, disable_any_whitespace=True)),
        use_tqdm=False)
    assert llm.stats()["num_preemptions"] > 0
    for out in outs:
        for comp in out.outputs:
            if comp.finish_reason == "stop":
                jsonschema.validate(json.loads(comp.text), schema)
            else:  # cut by max_tokens: still a prefix the grammar accepts
                assert comp.finish_reason == "length"
                matcher = xgr.GrammarMatcher(llm.engine.input_processor.grammar_compiler.compile(
                    StructuredOutputsParams(json=schema, disable_any_whitespace=True)))
                assert all(matcher.accept_token(t) for t in comp.token_ids)


@pytest.mark.parametrize("values, message", [
    ({"json": {"type": "nonsense"}}, r"structured_outputs\.json is invalid"),
    ({"json": "{not json"}, r"structured_outputs\.json must be a JSON schema"),
    ({"regex": "(unclosed"}, r"structured_outputs\.regex is invalid"),
    ({"grammar": "root ::= missing_rule"}, r"structured_outputs\.grammar is invalid"),
    ({"choice": []}, r"structured_outputs\.choice must be a non-empty list"),
    ({"regex": "a", "choice": ["a"]}, "exactly one of"),
    ({}, "exactly one of"),
    ({"json_object": True, "whitespace_pattern": " "}, r"whitespace_pattern is not supported"),
    ({"json_objekt": True}, "unknown field"),
])
def test_invalid_constraints_name_the_field(values, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(structured_outputs=values)


def test_a_dict_becomes_structured_outputs_params_and_the_engine_keeps_serving(llm_fp32):
    params = SamplingParams.from_dict({"temperature": 0, "max_tokens": 8,
                                       "structured_outputs": {"choice": ["yes", "no"]}})
    assert params.structured_outputs == StructuredOutputsParams(choice=["yes", "no"])
    with pytest.raises(ValueError, match="structured_outputs"):
        llm_fp32.generate("Hi", SamplingParams(structured_outputs={"regex": "["}), use_tqdm=False)
    out = llm_fp32.generate("Is the sky blue?", params, use_tqdm=False)[0].outputs[0]
    assert out.text in ("yes", "no") and out.finish_reason == "stop"


def test_speculative_engine_drafts_for_free_rows_only_and_keeps_constrained_output(llm_fp32):
    """n-gram speculation beside a grammar: the constrained sequence gets no drafts (its mask
    is only known for the matcher's current state) and decodes exactly as without
    speculation; the unconstrained, repetitive one is drafted for."""
    date = StructuredOutputsParams(regex=r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]")
    constrained = (_chat(llm_fp32, "When is it?"),
                   SamplingParams(temperature=0, max_tokens=20, structured_outputs=date))
    free = ("one two three four one two three four one two three four one two",
            SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    expected = [o.outputs[0].token_ids for o in llm_fp32.generate(
        [constrained[0], free[0]], [constrained[1], free[1]], use_tqdm=False)]
    spec = LLM(dtype="float32", num_kv_blocks=64, speculative_config={
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3})
    try:
        outs = spec.generate([constrained[0], free[0]], [constrained[1], free[1]], use_tqdm=False)
        stats = spec.stats()
    finally:
        spec.shutdown()
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert stats["spec_decode_num_draft_tokens"] > 0
