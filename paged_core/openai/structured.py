"""OpenAI request fields -> ``StructuredOutputsParams``.

Sources, each reported as its own ``param`` in a 400: ``response_format``
(``json_object``; ``json_schema`` with ``{"name", "schema", "strict"}``) and
vLLM's extras ``structured_outputs`` (an object of ``StructuredOutputsParams``
fields), ``guided_json``, ``guided_regex``, ``guided_choice``,
``guided_grammar``. At most one may be set; a forced tool call (``tool_choice``
"required" or a named function) is another, and cannot be combined with them.
"""
from __future__ import annotations

from typing import Any

from paged_core.structured_outputs import StructuredOutputsParams

from .errors import OpenAIError

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}


def _sources(req: Any) -> dict[str, dict[str, Any]]:
    """Every constraint the request sets, by the request field that set it."""
    found: dict[str, dict[str, Any]] = {}
    fmt = getattr(req, "response_format", None)
    if fmt is not None and fmt.type == "json_object":
        found["response_format"] = {"json_object": True}
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.json_schema is None:
            raise OpenAIError(400, "response_format of type json_schema needs json_schema."
                                   "schema", param="response_format")
        found["response_format"] = {"json": fmt.json_schema.json_schema}
    if req.structured_outputs is not None:
        found["structured_outputs"] = req.structured_outputs
    for name, kind in _GUIDED.items():
        if getattr(req, name) is not None:
            found[name] = {kind: getattr(req, name)}
    return found


def structured_outputs_of(req: Any) -> StructuredOutputsParams | None:
    """The request's constraint (or ``None``); 400 naming the field for a bad one."""
    found = _sources(req)
    if len(found) > 1:
        raise OpenAIError(400, f"set at most one of {sorted(found)}: each constrains the whole "
                               f"output", param=sorted(found)[1])
    if not found:
        return None
    (param, values), = found.items()
    try:
        return StructuredOutputsParams.from_dict(values)
    except ValueError as exc:
        raise OpenAIError(400, str(exc), param=param) from None
