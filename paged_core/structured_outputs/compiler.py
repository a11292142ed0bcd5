"""``GrammarCompilerCache``: compiles a request's constraint against the engine's vocabulary.

One ``xgrammar.GrammarCompiler`` per engine, built on first use (reading the
vocabulary takes ~0.6 s, so engines that never see a constraint never pay it).
xgrammar keeps compiled grammars in its own cache keyed by the grammar's text,
so a schema seen before compiles in well under a millisecond. Thread-safe:
``AsyncEngine`` compiles in the caller's worker thread, never on the step loop.

Invariants: the vocabulary size is the model's (the logits' width), and the
stop tokens are the engine's EOS ids, so a matcher allows EOS exactly where its
grammar is complete.
"""
from __future__ import annotations

import threading
import time

import xgrammar as xgr

from ..exceptions import ParamValidationError
from .params import StructuredOutputsParams

_CACHE_LIMIT_BYTES = 256 << 20


class GrammarCompilerCache:
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: frozenset[int],
                 max_threads: int = 2) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._stop_token_ids = sorted(stop_token_ids)
        self._max_threads = max_threads
        self._compiler: xgr.GrammarCompiler | None = None
        self._lock = threading.Lock()
        self.num_compiled = 0
        self.compile_seconds = 0.0  # total time in compile(), cache hits included

    def compile(self, params: StructuredOutputsParams) -> xgr.CompiledGrammar:
        start = time.perf_counter()
        try:
            compiled = self._get_compiler().compile_grammar(params.xgrammar_grammar)
        except Exception as exc:  # e.g. a grammar xgrammar parses but cannot compile
            raise ParamValidationError(f"structured_outputs could not be compiled: {exc}",
                                       "structured_outputs") from None
        with self._lock:
            self.num_compiled += 1
            self.compile_seconds += time.perf_counter() - start
        return compiled

    def _get_compiler(self) -> xgr.GrammarCompiler:
        with self._lock:
            if self._compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=self._vocab_size,
                    stop_token_ids=self._stop_token_ids)
                self._compiler = xgr.GrammarCompiler(
                    info, max_threads=self._max_threads, cache_enabled=True,
                    cache_limit_bytes=_CACHE_LIMIT_BYTES)
            return self._compiler
