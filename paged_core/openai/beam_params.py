"""OpenAI request with ``use_beam_search: true`` -> ``BeamSearchParams`` (vLLM's extra).

``n`` is the beam width (the response has ``n`` choices, best first);
``length_penalty``, ``ignore_eos``, ``temperature`` and
``include_stop_str_in_output`` pass through; as in vLLM, the other sampling
fields (``top_p``, ``seed``, ``stop``, ...) do not apply to beam search and are
ignored. Value errors are 400s naming the request field (``n`` for ``beam_width``).
"""
from __future__ import annotations

from paged_core.beam_search.params import BeamSearchParams

from .errors import OpenAIError, bad_request
from .protocol import SamplingFields

_PASS_THROUGH = ("length_penalty", "ignore_eos", "temperature", "include_stop_str_in_output")


def beam_search_params(req: SamplingFields, max_tokens: int | None,
                       rename: dict[str, str]) -> BeamSearchParams:
    """``rename`` maps engine field names to this request's (``beam_width`` -> ``n``,
    ``max_tokens`` -> ``max_completion_tokens``: ``params.request_field_names``)."""
    if max_tokens is None:
        raise OpenAIError(400, "max_tokens is required with use_beam_search",
                          param=rename.get("max_tokens", "max_tokens"))
    values = {name: getattr(req, name) for name in _PASS_THROUGH if getattr(req, name) is not None}
    try:
        return BeamSearchParams(beam_width=req.n, max_tokens=max_tokens, **values)
    except ValueError as exc:
        raise bad_request(exc, rename=rename) from None
