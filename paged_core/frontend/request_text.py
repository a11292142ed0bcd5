"""``RequestText``: the text side of one sampling request: its samples' tokens and text,
stop strings and streamed output deltas, built from the core's ``EngineCoreOutput``s.

The core appends tokens and ends a sample on what tokens alone decide (EOS, a stop token,
the grammar's end, ``max_tokens``, the context); this side detokenizes what was appended,
one token at a time, and finds stop strings: a match ends the sample here at once, and the
``StopAtString`` it returns tells the core to end it too. Invariant: text handed out is
never taken back; while stop strings may still match, the last ``max(len(stop)) - 1``
characters are held back.
"""
from __future__ import annotations

from ..requests.engine_io import EngineCoreOutput, EngineRequest, StopAtString
from ..outputs import RequestOutput
from ..sampling_params import RequestOutputKind, SamplingParams
from .detokenizer import IncrementalDetokenizer
from .sample_text import SampleText
from .text_state import TextState
from .token_decoder import token_decoder


class RequestText(TextState):
    def __init__(self, source: EngineRequest, tokenizer) -> None:
        super().__init__(source)
        self.params: SamplingParams = source.params
        self.tokenizer = tokenizer
        self.decode_token = token_decoder(tokenizer, skip_special_tokens=False)  # logprobs
        self.holdback = 0
        if self.params.stop and not self.params.include_stop_str_in_output:
            self.holdback = max(len(s) for s in self.params.stop) - 1
        self.samples: list[SampleText] = []  # by sample index; grown as the request forks
        self._sample(0)

    def absorb(self, out: EngineCoreOutput) -> StopAtString | None:
        """Detokenize the tokens the core appended to sample ``out.index``, one by one,
        recording their log-probabilities. After each, look for a stop string, unless that
        token ended the sample itself (EOS, a stop token, the grammar's end) or
        ``min_tokens`` are not out yet. At the first match the sample ends there."""
        self.observe(out)
        params = self.params
        sample = self._sample(out.index)
        last = len(out.new_token_ids) - 1
        for offset, (token, lp) in enumerate(zip(out.new_token_ids, out.new_logprobs)):
            sample.token_ids.append(token)
            if lp is not None:
                sample.record_logprobs(token, lp, self.decode_token)
            ended_by_token = offset == last and out.finish_reason == "stop"
            old_len = len(sample.text)
            end = len(sample.token_ids)
            sample.text += sample.detokenizer.step(sample.token_ids, end, final=ended_by_token)
            num_output = end - sample.num_prompt_tokens
            if params.stop and not ended_by_token and num_output >= params.min_tokens:
                stop = sample.find_stop_string(params.stop, old_len,
                                               params.include_stop_str_in_output)
                if stop is not None:
                    sample.finish_reason, sample.stop_reason = "stop", stop
                    return StopAtString(self.request_id, out.index, num_output, last - offset, stop)
        if out.finish_reason is not None:
            sample.finish_reason, sample.stop_reason = out.finish_reason, out.stop_reason
        return None

    @property
    def finished(self) -> bool:
        """Every one of the ``n`` samples has its finish reason, or the request was ended."""
        return self.ended or (len(self.samples) == self.params.n
                              and all(s.finish_reason is not None for s in self.samples))

    @property
    def reports_now(self) -> bool:
        return self.params.output_kind != RequestOutputKind.FINAL_ONLY or self.finished

    def make_output(self) -> RequestOutput:
        """The request's output now, with deltas since the previous one; under
        ``RequestOutputKind.DELTA`` the deltas alone."""
        delta_only = self.params.output_kind == RequestOutputKind.DELTA
        completions = [sample.completion(index, self.holdback, delta_only)
                       for index, sample in enumerate(self.samples)]
        return self.request_output(completions, self.finished)

    def _sample(self, index: int) -> SampleText:
        """Sample ``index``'s text (new samples fork before any output: they start empty)."""
        params = self.params
        while len(self.samples) <= index:
            detokenizer = IncrementalDetokenizer(self.tokenizer, self.prompt_token_ids,
                                                 params.skip_special_tokens)
            self.samples.append(SampleText(
                list(self.prompt_token_ids), len(self.prompt_token_ids), detokenizer,
                [] if params.logprobs is not None else None))
        return self.samples[index]
