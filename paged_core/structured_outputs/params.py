"""``StructuredOutputsParams``: what a request's output must look like (vLLM's names).

Exactly one constraint is set: ``json`` (a JSON schema, as a dict or a JSON
string), ``regex``, ``choice`` (a list of strings), ``grammar`` (xgrammar
EBNF, GBNF-like) or ``json_object=True`` (any JSON object). Construction checks
everything that does not need the tokenizer: types, exclusivity, and that the
schema / regex / grammar parses (it is turned into an ``xgrammar.Grammar``
here), so a bad constraint is a ``ParamValidationError`` (``param``
``structured_outputs``) naming ``structured_outputs.<field>`` before the request
reaches an engine. Compilation against a vocabulary happens later (``GrammarCompilerCache``).
"""
from __future__ import annotations

import json as _json
from dataclasses import dataclass, field, fields
from typing import Any

import xgrammar as xgr

from ..exceptions import ParamValidationError

_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object")
# Longest run of whitespace between JSON tokens: room for indentation, none for a small
# model's endless newlines (which would otherwise run to max_tokens).
_MAX_WHITESPACE = 24


def _invalid(message: str) -> ParamValidationError:
    return ParamValidationError(message, "structured_outputs")


@dataclass
class StructuredOutputsParams:
    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None
    # The parsed xgrammar.Grammar: derived from the fields above, not compared.
    _grammar: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        chosen = [name for name in _CONSTRAINTS
                  if getattr(self, name) is not None and getattr(self, name) is not False]
        if len(chosen) != 1:
            raise _invalid(
                "structured_outputs must set exactly one of json, regex, choice, grammar or "
                f"json_object, got {chosen or 'none'}")
        for name in ("disable_any_whitespace", "disable_additional_properties"):
            if not isinstance(getattr(self, name), bool):
                raise _invalid(f"structured_outputs.{name} must be true or false, "
                                 f"got {getattr(self, name)!r}")
        for name in ("whitespace_pattern", "structural_tag"):
            if getattr(self, name) is not None:
                raise _invalid(f"structured_outputs.{name} is not supported (xgrammar backend)")
        kind = chosen[0]
        self._grammar = _PARSERS[kind](self)

    @classmethod
    def from_dict(cls, values: Any) -> "StructuredOutputsParams":
        """Build from a JSON object, rejecting unknown field names."""
        if isinstance(values, cls):
            return values
        if not isinstance(values, dict):
            raise _invalid(f"structured_outputs must be an object with one of {_CONSTRAINTS}, "
                             f"got {values!r}")
        known = {f.name for f in fields(cls) if f.init}
        unknown = sorted(set(values) - known)
        if unknown:
            raise _invalid(f"structured_outputs has unknown field(s) {unknown}; allowed: "
                             f"{sorted(known)}")
        return cls(**values)

    @property
    def xgrammar_grammar(self) -> "xgr.Grammar":
        return self._grammar


def _parse(name: str, build, *args: Any, **kwargs: Any):
    try:
        return build(*args, **kwargs)
    except Exception as exc:  # xgrammar raises RuntimeError / ValueError with its own message
        raise _invalid(f"structured_outputs.{name} is invalid: {exc}") from None


def _schema_grammar(params: StructuredOutputsParams, name: str, schema: Any):
    if isinstance(schema, str):
        try:
            schema = _json.loads(schema)
        except _json.JSONDecodeError as exc:
            raise _invalid(f"structured_outputs.{name} must be a JSON schema (an object or "
                             f"its JSON text): {exc}") from None
    if not isinstance(schema, (dict, bool)):
        raise _invalid(f"structured_outputs.{name} must be a JSON schema object, got "
                         f"{type(schema).__name__}")
    text = _json.dumps(schema)  # key order kept: xgrammar emits properties in schema order
    any_whitespace = not params.disable_any_whitespace
    # strict_mode: properties the schema does not name are refused (so
    # disable_additional_properties always holds, as in vLLM's xgrammar backend)
    return _parse(name, xgr.Grammar.from_json_schema, text, any_whitespace=any_whitespace,
                  strict_mode=True, max_whitespace_cnt=_MAX_WHITESPACE if any_whitespace else None)


def _json_grammar(params: StructuredOutputsParams):
    return _schema_grammar(params, "json", params.json)


def _json_object_grammar(params: StructuredOutputsParams):
    if params.json_object is not True:
        raise _invalid(f"structured_outputs.json_object must be true, got "
                         f"{params.json_object!r}")
    return _schema_grammar(params, "json_object", {"type": "object"})


def _regex_grammar(params: StructuredOutputsParams):
    if not isinstance(params.regex, str) or not params.regex:
        raise _invalid(f"structured_outputs.regex must be a non-empty string, got "
                         f"{params.regex!r}")
    return _parse("regex", xgr.Grammar.from_regex, params.regex)


def _choice_grammar(params: StructuredOutputsParams):
    choice = params.choice
    if (not isinstance(choice, (list, tuple)) or not choice
            or not all(isinstance(c, str) and c for c in choice)):
        raise _invalid(f"structured_outputs.choice must be a non-empty list of non-empty "
                         f"strings, got {choice!r}")
    params.choice = list(choice)
    # EBNF string literals take JSON's escapes; one alternative per choice.
    ebnf = "root ::= " + " | ".join(_json.dumps(c, ensure_ascii=False) for c in params.choice)
    return _parse("choice", xgr.Grammar.from_ebnf, ebnf)


def _ebnf_grammar(params: StructuredOutputsParams):
    if not isinstance(params.grammar, str) or not params.grammar.strip():
        raise _invalid(f"structured_outputs.grammar must be a non-empty EBNF string, got "
                         f"{params.grammar!r}")
    return _parse("grammar", xgr.Grammar.from_ebnf, params.grammar)


_PARSERS = {"json": _json_grammar, "json_object": _json_object_grammar, "regex": _regex_grammar,
            "choice": _choice_grammar, "grammar": _ebnf_grammar}
