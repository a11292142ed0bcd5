"""``BeamText``: the text side of a beam search: its ranked beams, decoded.

A beam search streams nothing: its one ``EngineCoreOutput`` comes when the search ends (or
is aborted) and holds ``beam_width`` ranked beams (``RankedBeam``: token ids, cumulative
log-probability, per-token records, finish reason), best first; its output holds them as
completions (``index`` = rank). A completion that ended on EOS leaves the EOS token out of
its text unless ``include_stop_str_in_output``.
"""
from __future__ import annotations

from ..beam_search.params import BeamSearchParams
from ..beam_search.results import RankedBeam
from ..requests.engine_io import EngineCoreOutput, EngineRequest
from ..outputs import CompletionOutput, Logprob, RequestOutput
from .text_state import TextState


class BeamText(TextState):
    def __init__(self, source: EngineRequest, tokenizer) -> None:
        super().__init__(source)
        self.params: BeamSearchParams = source.params
        self.tokenizer = tokenizer
        self.beams: list[RankedBeam] | None = None  # set by the search's one output

    def absorb(self, out: EngineCoreOutput) -> None:
        self.observe(out)
        if out.beams is not None:
            self.beams = out.beams

    @property
    def finished(self) -> bool:
        return self.beams is not None or self.ended

    def make_output(self) -> RequestOutput:
        """The search's output: its ranked beams, decoded (none before it ended)."""
        completions = [self._completion(index, beam)
                       for index, beam in enumerate(self.beams or [])]
        return self.request_output(completions, self.finished)

    def _completion(self, index: int, beam: RankedBeam) -> CompletionOutput:
        generated = beam.token_ids[len(self.prompt_token_ids):]
        decode = self.tokenizer.decode
        ends_with_eos = beam.finish_reason == "stop"
        text = decode(generated[:-1] if ends_with_eos else generated, skip_special_tokens=True)
        if ends_with_eos and self.params.include_stop_str_in_output:
            text += decode(generated[-1:])
        logprobs = [{t: Logprob(lp, rank, decode([t]))} for t, lp, rank in beam.records]
        return CompletionOutput(
            index=index, text=text, token_ids=generated, cumulative_logprob=beam.cum_logprob,
            logprobs=logprobs, finish_reason=beam.finish_reason, delta_text=text,
            delta_token_ids=list(generated), delta_logprobs=logprobs)
