"""Structured outputs (xgrammar): constrain decoding to a JSON schema, regex, choice or grammar.

``StructuredOutputsParams`` (the request side, vLLM's names) is parsed and
checked at construction; ``GrammarCompilerCache`` compiles it against the
engine's vocabulary (off the step loop); each sequence holds a
``SequenceGrammar``; the sampler masks constrained rows with ``GrammarBitmask``.
"""
from .bitmask import GrammarBitmask
from .compiler import GrammarCompilerCache
from .matcher import SequenceGrammar
from .params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams", "GrammarCompilerCache", "SequenceGrammar", "GrammarBitmask"]
