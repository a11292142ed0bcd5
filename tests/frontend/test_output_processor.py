"""The output processor: text, stop strings and deltas from what the core reported
(``EngineCoreOutput``s), and stop strings handed back to the core (``StopAtString``)."""
from paged_core.beam_search.params import BeamSearchParams
from paged_core.requests.engine_io import EngineCoreOutput, EngineRequest
from paged_core.frontend.output_processor import OutputProcessor
from paged_core.sampling_params import SamplingParams


def _started(tokenizer, **params) -> OutputProcessor:
    """A fresh output processor that knows request "r" (prompt "Say:")."""
    processor = OutputProcessor(tokenizer)
    processor.add_request(EngineRequest("r", tuple(tokenizer.encode("Say:")),
                                        SamplingParams(**params),
                                        frozenset({tokenizer.eos_token_id}), prompt="Say:"))
    return processor


def _appended(tokens, **fields) -> EngineCoreOutput:
    return EngineCoreOutput("r", 0, list(tokens), [None] * len(tokens), **fields)


def test_a_stop_string_inside_a_multi_token_append_cuts_tokens_and_text(tokenizer):
    processor = _started(tokenizer, stop=["world"], max_tokens=50)
    tokens = tokenizer.encode(" hello world again and again")
    # as verified drafts arrive: several tokens in one step
    result = processor.process_outputs([_appended(tokens)])
    (stop,) = result.stops
    keep = stop.num_output_tokens
    assert (stop.request_id, stop.index, stop.stop) == ("r", 0, "world") and keep < len(tokens)
    assert stop.num_dropped == len(tokens) - keep  # the core drops them from its count
    assert "world" in tokenizer.decode(tokens[:keep])
    assert "world" not in tokenizer.decode(tokens[:keep - 1])
    (out,) = result.request_outputs
    completion = out.outputs[0]
    assert out.finished and completion.text == " hello " and out.prompt == "Say:"
    assert completion.token_ids == tokens[:keep]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", "world")
    assert len(processor) == 0 and not result.failed  # a finished request's state is dropped


def test_streamed_deltas_hold_back_what_a_stop_string_may_still_take(tokenizer):
    processor = _started(tokenizer, stop=["never seen!"], max_tokens=50)
    tokens = tokenizer.encode(" one two three four five")
    deltas = []
    for i, token in enumerate(tokens):
        result = processor.process_outputs([_appended([token])])
        assert not result.stops
        (out,) = result.request_outputs
        full = tokenizer.decode(tokens[:i + 1])
        assert out.outputs[0].text == full[:max(len(full) - len("never seen!") + 1, 0)]
        deltas.append(out.outputs[0].delta_text)
    final = processor.finish("r", [EngineCoreOutput("r", 0, finish_reason="abort")])
    deltas.append(final.outputs[0].delta_text)
    assert final.finished and "".join(deltas) == tokenizer.decode(tokens)
    assert final.outputs[0].finish_reason == "abort"


def test_a_token_that_ends_the_sequence_is_not_searched_for_stop_strings(tokenizer):
    processor = _started(tokenizer, stop=["Hi"], max_tokens=50, skip_special_tokens=False)
    result = processor.process_outputs([_appended([tokenizer.eos_token_id],
                                                  finish_reason="stop")])  # the core's EOS
    assert not result.stops
    completion = result.request_outputs[0].outputs[0]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", None)


def test_n_samples_finish_together_and_an_error_fails_the_request_alone(tokenizer):
    processor = _started(tokenizer, n=2, max_tokens=50)
    processor.add_request(EngineRequest("b", (1, 2), SamplingParams(), frozenset()))
    result = processor.process_outputs([_appended([5], finish_reason="length"),
                                        EngineCoreOutput("b", 0, [7], [None])])
    assert [o.request_id for o in result.request_outputs] == ["r", "b"]
    assert not result.request_outputs[0].finished  # sample 1 has not reported yet
    failure = RuntimeError("boom")
    result = processor.process_outputs([EngineCoreOutput("r", 1, [6], [None], finish_reason="length"),
                                        EngineCoreOutput("b", 0, error=failure)])
    r, b = result.request_outputs[1], result.request_outputs[0]
    assert r.finished and [c.token_ids for c in r.outputs] == [[5], [6]]
    assert b.finished and b.error.__cause__ is failure and b.outputs == []
    assert len(processor) == 0


def test_an_aborted_request_leaves_no_text_state(llm_fp32):
    engine = llm_fp32.engine
    for params in (SamplingParams(n=2, max_tokens=5), BeamSearchParams(beam_width=2, max_tokens=5)):
        engine.add_request(engine.make_request("aborted", "Hello there", params))
        out = engine.abort_request("aborted")  # before the prompt ran: no sample forked yet
        assert out.finished and len(engine.output_processor) == 0


def _stream_of(tokenizer, tokens, **params) -> list:
    """The request outputs of "r" as its tokens arrive one a step, the last ending it."""
    processor = _started(tokenizer, max_tokens=len(tokens), **params)
    outputs = []
    for i, token in enumerate(tokens):
        ends = {"finish_reason": "length"} if i == len(tokens) - 1 else {}
        outputs += processor.process_outputs([_appended([token], **ends)]).request_outputs
    assert len(processor) == 0
    return outputs


def test_final_only_reports_once_and_delta_reports_only_what_is_new(tokenizer):
    from paged_core.sampling_params import RequestOutputKind
    tokens = tokenizer.encode(" Grüße aus Köln, 東京 and 🚀 too")
    cumulative = _stream_of(tokenizer, tokens, logprobs=None)
    (final,) = _stream_of(tokenizer, tokens, output_kind=RequestOutputKind.FINAL_ONLY)
    last = cumulative[-1].outputs[0]
    assert final.finished and final.outputs[0].text == last.text == tokenizer.decode(tokens)
    assert final.outputs[0].token_ids == last.token_ids == tokens
    assert final.outputs[0].delta_text == last.text  # its one output: all of it is new

    deltas = _stream_of(tokenizer, tokens, output_kind=RequestOutputKind.DELTA)
    assert len(deltas) == len(cumulative) == len(tokens)
    assert "".join(out.outputs[0].text for out in deltas) == tokenizer.decode(tokens)
    assert [t for out in deltas for t in out.outputs[0].token_ids] == tokens
    for delta, full in zip(deltas, cumulative):
        assert delta.outputs[0].text == full.outputs[0].delta_text
        assert delta.outputs[0].token_ids == full.outputs[0].delta_token_ids == [
            tokens[len(full.outputs[0].token_ids) - 1]]
    assert deltas[-1].finished and deltas[-1].outputs[0].finish_reason == "length"
