"""``BeamText``: the text side of a beam search (``BeamSearchRequest``): its ranked beams,
decoded.

A beam search streams nothing: its one output comes when the search ends (or is aborted)
and holds ``beam_width`` completions, best first (``index`` = rank). A completion that
ended on EOS leaves the EOS token out of its text unless ``include_stop_str_in_output``.
"""
from __future__ import annotations

import time

from ..beam_search.request import BeamSearchRequest, RankedBeam
from ..outputs import CompletionOutput, Logprob, RequestOutput


class BeamText:
    def __init__(self, request: BeamSearchRequest, tokenizer) -> None:
        self.request = request
        self.tokenizer = tokenizer

    def make_output(self) -> RequestOutput:
        """The search's output now: its ranked beams so far, decoded."""
        request = self.request
        completions = [_completion(request, index, beam, self.tokenizer)
                       for index, beam in enumerate(request.ranked_beams())]
        if request.is_finished and request.metrics.finished_time is None:
            request.metrics.finished_time = time.monotonic()
        return RequestOutput(request.request_id, request.prompt, request.prompt_token_ids,
                             completions, request.is_finished, request.metrics,
                             request.num_cached_tokens)


def _completion(request: BeamSearchRequest, index: int, beam: RankedBeam,
                tokenizer) -> CompletionOutput:
    generated = beam.token_ids[len(request.prompt_token_ids):]
    decode = tokenizer.decode
    ends_with_eos = beam.finish_reason == "stop"
    text = decode(generated[:-1] if ends_with_eos else generated, skip_special_tokens=True)
    if ends_with_eos and request.params.include_stop_str_in_output:
        text += decode(generated[-1:])
    logprobs = [{t: Logprob(lp, rank, decode([t]))} for t, lp, rank in beam.records]
    return CompletionOutput(
        index=index, text=text, token_ids=generated, cumulative_logprob=beam.cum_logprob,
        logprobs=logprobs, finish_reason=beam.finish_reason, delta_text=text,
        delta_token_ids=list(generated), delta_logprobs=logprobs)
