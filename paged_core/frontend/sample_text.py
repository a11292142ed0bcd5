"""``SampleText``: the text side of one sample of a sampling request, kept by the output
processor from the ``EngineCoreOutput``s the core reports for it.

It holds the sample's tokens (prompt + output, as reported), its incremental detokenizer,
its text so far, its log-probabilities (decoded), its finish reason and the streaming
cursors. Invariant: ``text`` is the detokenized output up to the last token absorbed, cut
at a stop string when one matched (``token_ids`` cut after that token); what was handed
out (``emitted_*``) is never taken back.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..outputs import CompletionOutput, Logprob
from ..sample.sampler import TokenLogprobs
from .detokenizer import IncrementalDetokenizer


@dataclass
class SampleText:
    token_ids: list[int]  # the prompt's, then the output's
    num_prompt_tokens: int
    detokenizer: IncrementalDetokenizer
    logprobs: list[dict[int, Logprob]] | None  # None unless the request asked for logprobs
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    text: str = ""
    cumulative_logprob: float | None = None
    emitted_chars: int = 0
    emitted_tokens: int = 0
    emitted_logprobs: int = 0

    def record_logprobs(self, token: int, lp: TokenLogprobs, decode) -> None:
        """The sampled token's log-probability and the top alternatives, decoded."""
        entry = {token: Logprob(lp.token_logprob, lp.token_rank, decode([token]))}
        for rank, (tid, value) in enumerate(lp.top, start=1):
            if tid not in entry:
                entry[tid] = Logprob(value, rank, decode([tid]))
        self.logprobs.append(entry)
        self.cumulative_logprob = (self.cumulative_logprob or 0.0) + lp.token_logprob

    def find_stop_string(self, stops: list[str], old_len: int,
                         include_stop: bool) -> str | None:
        """The stop string that ends earliest in the text added after ``old_len`` (it may
        start before), cutting ``text`` there (after it with ``include_stop``); else None."""
        window_start = max(old_len - max(len(s) for s in stops) + 1, 0)
        best: tuple[int, str] | None = None
        for stop in stops:
            pos = self.text.find(stop, window_start)
            if pos != -1 and (best is None or pos < best[0]):
                best = (pos, stop)
        if best is None:
            return None
        pos, stop = best
        self.text = self.text[:pos + len(stop) if include_stop else pos]
        return stop

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    def completion(self, index: int, holdback: int, delta_only: bool = False) -> CompletionOutput:
        """The sample's output now, with deltas since the previous call; advances the
        cursors. While the sample runs, the last ``holdback`` characters (a stop string
        may still start there) are not handed out. With ``delta_only`` (``DELTA`` outputs)
        ``text``, ``token_ids`` and ``logprobs`` hold the deltas too."""
        out_ids = self.output_token_ids  # a fresh list
        finished = self.finish_reason is not None
        visible = len(self.text) if finished else max(len(self.text) - holdback, 0)
        visible = max(visible, self.emitted_chars)
        delta_lp = None
        if self.logprobs is not None:
            delta_lp = self.logprobs[self.emitted_logprobs:]
            self.emitted_logprobs = len(self.logprobs)
        delta_text = self.text[self.emitted_chars:visible]
        delta_ids = out_ids[self.emitted_tokens:]
        out = CompletionOutput(
            index=index, text=delta_text if delta_only else self.text[:visible],
            token_ids=delta_ids if delta_only else out_ids,
            cumulative_logprob=self.cumulative_logprob,
            logprobs=delta_lp if delta_only else self.logprobs,
            finish_reason=self.finish_reason, stop_reason=self.stop_reason,
            delta_text=delta_text, delta_token_ids=delta_ids, delta_logprobs=delta_lp)
        self.emitted_chars = visible
        self.emitted_tokens = len(out_ids)
        return out
