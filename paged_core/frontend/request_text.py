"""``RequestText``: the text side of one sampling request (``Request``): its samples' text,
stop strings and streamed output deltas.

The core appends tokens and ends a sample on what tokens alone decide (EOS, a stop token,
the grammar's end, ``max_tokens``, the context); this side detokenizes what was appended,
one token at a time, and finds stop strings, which the core then applies
(``Request.stop_at_string``). Invariant: text handed out is never taken back; while stop
strings may still match, the last ``max(len(stop)) - 1`` characters are held back.
"""
from __future__ import annotations

import time

from ..core.sequence import Sequence
from ..outputs import RequestOutput
from ..request import Request
from ..sample.sampler import TokenLogprobs
from .detokenizer import IncrementalDetokenizer
from .sample_text import SampleText


class RequestText:
    def __init__(self, request: Request, tokenizer) -> None:
        self.request = request
        self.tokenizer = tokenizer
        params = request.params
        self.holdback = 0
        if params.stop and not params.include_stop_str_in_output:
            self.holdback = max(len(s) for s in params.stop) - 1
        self.samples: list[SampleText] = []  # by sample index; grown as the request forks
        self._sample(0)

    def absorb(self, seq: Sequence, tokens: list[int],
               logprobs: list[TokenLogprobs | None]) -> tuple[int, str] | None:
        """Detokenize the ``tokens`` the core just appended to ``seq``, one by one, recording
        their log-probabilities. After each, look for a stop string, unless that token
        ended ``seq`` itself (EOS, a stop token, the grammar's end) or ``min_tokens`` are
        not out yet. Returns (output tokens to keep, the stop string) at the first match."""
        params = self.request.params
        sample = self._sample(seq.sample_index)
        first = seq.num_tokens - len(tokens)
        for offset, (token, lp) in enumerate(zip(tokens, logprobs)):
            end = first + offset + 1
            if lp is not None:
                sample.record_logprobs(token, lp, self.tokenizer.decode)
            ended_by_token = end == seq.num_tokens and seq.finish_reason == "stop"
            old_len = len(sample.text)
            sample.text += sample.detokenizer.step(seq.token_ids, end, final=ended_by_token)
            num_output = end - seq.num_prompt_tokens
            if params.stop and not ended_by_token and num_output >= params.min_tokens:
                stop = sample.find_stop_string(params.stop, old_len,
                                               params.include_stop_str_in_output)
                if stop is not None:
                    return num_output, stop
        return None

    def make_output(self) -> RequestOutput:
        """The request's output now, with deltas since the previous one."""
        request = self.request
        completions = [self._sample(i).completion(i, s.seq.output_token_ids, s.seq.finish_reason,
                                                  s.seq.stop_reason, self.holdback)
                       for i, s in enumerate(request.samples)]
        finished = request.is_complete
        if finished and request.metrics.finished_time is None:
            request.metrics.finished_time = time.monotonic()
        return RequestOutput(request.request_id, request.prompt, request.prompt_token_ids,
                             completions, finished, request.metrics, request.num_cached_tokens)

    def _sample(self, index: int) -> SampleText:
        """Sample ``index``'s text (new samples fork before any output: they start empty)."""
        params = self.request.params
        while len(self.samples) <= index:
            detokenizer = IncrementalDetokenizer(self.tokenizer, self.request.prompt_token_ids,
                                                 params.skip_special_tokens)
            self.samples.append(SampleText(detokenizer,
                                           [] if params.logprobs is not None else None))
        return self.samples[index]
