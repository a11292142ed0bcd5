"""``OutputProcessor``: the front end's output side, vLLM v1's name. The core appends tokens
and ends sequences on what tokens decide; this turns that into text and ``RequestOutput``s.

It keeps one text state per request from ``add_request`` until its final output: a sampling
request's ``RequestText`` (detokenizer, stop strings, log-probabilities, streaming deltas),
or a beam search's ``BeamText`` (its ranked beams, decoded when it reports). It never touches the KV cache or the
scheduler: a stop string it finds is handed back to the engine, which ends the sequence.
"""
from __future__ import annotations

from ..beam_search.request import BeamSearchRequest
from ..core.sequence import Sequence
from ..outputs import RequestOutput
from ..request import Request
from ..sample.sampler import TokenLogprobs
from .beam_text import BeamText
from .request_text import RequestText


class OutputProcessor:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        # request_id -> text state, until finished
        self.texts: dict[str, RequestText | BeamText] = {}

    def add_request(self, request: Request | BeamSearchRequest) -> None:
        kind = RequestText if isinstance(request, Request) else BeamText
        self.texts[request.request_id] = kind(request, self.tokenizer)

    def absorb(self, seq: Sequence, tokens: list[int],
               logprobs: list[TokenLogprobs | None]) -> tuple[int, str] | None:
        """Detokenize the tokens just appended to ``seq`` of a sampling request
        (``RequestText.absorb``); returns (output tokens to keep, stop string) where a stop
        string ends it."""
        return self.texts[seq.request.request_id].absorb(seq, tokens, logprobs)

    def make_output(self, request: Request | BeamSearchRequest) -> RequestOutput:
        """The request's output now (deltas since the previous one where it streams); a
        finished request's text state is dropped."""
        out = self.texts[request.request_id].make_output()
        if out.finished:
            del self.texts[request.request_id]
        return out

    def forget(self, request_id: str) -> None:
        """Drop a request's text state (it failed: its last output carries the error)."""
        self.texts.pop(request_id, None)

    def __len__(self) -> int:
        return len(self.texts)
