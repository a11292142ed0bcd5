"""``OutputProcessor``: the front end's output side, vLLM v1's name. The core reports token
ids (``EngineCoreOutput``s); this turns them into text and ``RequestOutput``s.

It keeps one text state per request from ``add_request`` until its final output: a sampling
request's ``RequestText`` (tokens, detokenizer, stop strings, log-probabilities, streaming
deltas), or a beam search's ``BeamText`` (its ranked beams, decoded when it reports). It
never touches the core: a stop string it finds ends the sample here and goes back to the
core as a ``StopAtString``; a request whose output raised here is reported ``failed`` for
the core to abort.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..requests.engine_io import EngineCoreOutput, EngineRequest, StopAtString
from ..outputs import RequestOutput
from .beam_text import BeamText
from .request_text import RequestText

TextOf = RequestText | BeamText

logger = logging.getLogger(__name__)


@dataclass
class ProcessedOutputs:
    """One step's result: the ``RequestOutput``s in the order their requests first came,
    the stop strings the core must apply, and the requests that failed here."""

    request_outputs: list[RequestOutput] = field(default_factory=list)
    stops: list[StopAtString] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


class OutputProcessor:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.texts: dict[str, TextOf] = {}  # request_id -> text state, until finished

    def add_request(self, source: EngineRequest) -> None:
        kind = BeamText if source.is_beam_search else RequestText
        self.texts[source.request_id] = kind(source, self.tokenizer)

    def process_outputs(self, outputs: list[EngineCoreOutput]) -> ProcessedOutputs:
        """Absorb a step's core outputs, then build one ``RequestOutput`` per request they
        touched that reports now (``RequestOutputKind.FINAL_ONLY``: once it finished; a
        finished request's text state is dropped). A request whose output raises
        here fails alone: its output carries the error and it is listed in ``failed``."""
        result = ProcessedOutputs()
        touched: dict[str, TextOf] = {}
        for out in outputs:
            text = self.texts.get(out.request_id)
            if text is None:  # it failed earlier in this step
                continue
            if out.error is not None:  # the core logged it and freed the request
                result.request_outputs.append(text.failed_output(out.error))
                del self.texts[out.request_id]
                touched.pop(out.request_id, None)
                continue
            try:
                stop = text.absorb(out)
            except Exception as exc:
                result.failed.append(out.request_id)
                result.request_outputs.append(self._fail(text, exc))
                touched.pop(out.request_id, None)
                continue
            if stop is not None:
                result.stops.append(stop)
            touched[out.request_id] = text
        for text in touched.values():
            if text.reports_now:
                self._report(text, result)
        return result

    def finish(self, request_id: str, outputs: list[EngineCoreOutput]) -> RequestOutput:
        """The last output of a request the core ended (an abort): ``outputs`` are its final
        core outputs; the request is finished whatever they hold."""
        text = self.texts[request_id]
        text.ended = True
        result = ProcessedOutputs()
        try:
            for out in outputs:
                text.absorb(out)
        except Exception as exc:
            return self._fail(text, exc)
        self._report(text, result)
        return result.request_outputs[0]

    def _report(self, text: TextOf, result: ProcessedOutputs) -> None:
        try:
            out = text.make_output()
        except Exception as exc:
            result.failed.append(text.request_id)
            result.request_outputs.append(self._fail(text, exc))
            return
        if out.finished:
            del self.texts[text.request_id]
        result.request_outputs.append(out)

    def _fail(self, text: TextOf, exc: BaseException) -> RequestOutput:
        """Log ``exc`` and drop the request's text state; its final output carries the error."""
        logger.error("request %s failed; the engine goes on with the other requests",
                     text.request_id, exc_info=exc)
        self.texts.pop(text.request_id, None)
        return text.failed_output(exc)

    def __len__(self) -> int:
        return len(self.texts)

    def __contains__(self, request_id: str) -> bool:
        """Whether ``request_id``'s final output is still to be made."""
        return request_id in self.texts
