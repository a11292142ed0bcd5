"""The output processor: text, stop strings and deltas for what the core appended."""
from paged_core.frontend.output_processor import OutputProcessor
from paged_core.request import Request
from paged_core.beam_search.params import BeamSearchParams
from paged_core.sampling_params import SamplingParams


def _request(tokenizer, **params) -> Request:
    prompt = tokenizer.encode("Say:")
    return Request("r", "Say:", prompt, SamplingParams(**params),
                   frozenset({tokenizer.eos_token_id}), 1000)


def _append(request, seq, tokens) -> None:
    for token in tokens:
        assert not request.append_token(seq, token)


def _started(tokenizer, **params):
    """A request known to a fresh output processor, and its one sequence."""
    request = _request(tokenizer, **params)
    processor = OutputProcessor(tokenizer)
    processor.add_request(request)
    return request, processor, request.sequences[0]


def test_a_stop_string_inside_a_multi_token_append_cuts_tokens_and_text(tokenizer):
    request, processor, seq = _started(tokenizer, stop=["world"], max_tokens=50)
    tokens = tokenizer.encode(" hello world again and again")
    _append(request, seq, tokens)  # as verified drafts arrive: several tokens in one step
    keep, stop = processor.absorb(seq, tokens, [None] * len(tokens))
    assert stop == "world" and keep < len(tokens)
    assert "world" in tokenizer.decode(tokens[:keep])
    assert "world" not in tokenizer.decode(tokens[:keep - 1])
    request.stop_at_string(seq, keep, stop)
    out = processor.make_output(request)
    completion = out.outputs[0]
    assert out.finished and completion.text == " hello "
    assert completion.token_ids == tokens[:keep] == seq.output_token_ids
    assert (completion.finish_reason, completion.stop_reason) == ("stop", "world")
    assert len(processor) == 0  # a finished request's text state is dropped


def test_streamed_deltas_hold_back_what_a_stop_string_may_still_take(tokenizer):
    request, processor, seq = _started(tokenizer, stop=["never seen!"], max_tokens=50)
    tokens = tokenizer.encode(" one two three four five")
    deltas = []
    for token in tokens:
        _append(request, seq, [token])
        assert processor.absorb(seq, [token], [None]) is None
        out = processor.make_output(request)
        full = tokenizer.decode(seq.output_token_ids)
        assert out.outputs[0].text == full[:max(len(full) - len("never seen!") + 1, 0)]
        deltas.append(out.outputs[0].delta_text)
    request.abort()
    final = processor.make_output(request)
    deltas.append(final.outputs[0].delta_text)
    assert final.finished and "".join(deltas) == tokenizer.decode(tokens)


def test_a_token_that_ends_the_sequence_is_not_searched_for_stop_strings(tokenizer):
    request, processor, seq = _started(tokenizer, stop=["Hi"], max_tokens=50, skip_special_tokens=False)
    eos = tokenizer.eos_token_id
    assert request.append_token(seq, eos)  # EOS: the core ends it on the token
    assert processor.absorb(seq, [eos], [None]) is None
    completion = processor.make_output(request).outputs[0]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", None)


def test_an_aborted_request_leaves_no_text_state(llm_fp32):
    engine = llm_fp32.engine
    for params in (SamplingParams(n=2, max_tokens=5), BeamSearchParams(beam_width=2, max_tokens=5)):
        engine.add_request(engine.make_request("aborted", "Hello there", params))
        out = engine.abort_request("aborted")  # before the prompt ran: no sample forked yet
        assert out.finished and len(engine.output_processor) == 0
