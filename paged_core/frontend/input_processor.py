"""The front end's first step: a prompt and its params in, a validated request out (vLLM v1's
``Processor``).

``InputProcessor.process`` checks the params' type and their fit to the model, tokenizes
the prompt (keeping its last ``truncate_prompt_tokens`` tokens where asked), refuses one that
leaves no room to generate, spells ``bad_words`` in tokens, and compiles a structured-output
grammar (cached), so the engine core only ever sees requests it can run. It raises
``ValueError`` saying what to change and touches no engine state; what it returns is a
frozen ``EngineRequest``: ``AsyncEngine`` runs it
in a worker thread and admits a request only once its grammar is ready.
"""
from __future__ import annotations

from ..beam_search.params import BeamSearchParams
from ..requests.engine_io import EngineRequest
from .prompts import PromptInput, prompt_cache_salt, tokenize_prompt
from ..sample.bad_words import bad_words_token_ids
from ..sampling_params import SamplingParams
from ..structured_outputs import GrammarCompilerCache


class InputProcessor:
    """Turns prompts into requests for one model and KV cache (the limits are fixed)."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: set[int], max_model_len: int,
                 max_total_tokens: int, num_kv_blocks: int, block_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.max_total_tokens = max_total_tokens  # min(max_model_len, KV cache capacity)
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.grammar_compiler = GrammarCompilerCache(tokenizer, vocab_size, eos_token_ids)

    def process(self, request_id: str, prompt: PromptInput,
                params: SamplingParams | BeamSearchParams | None = None, *,
                priority: int = 0, tenant: str | None = None,
                deadline: float | None = None, lora_id: int | None = None) -> EngineRequest:
        """The ``EngineRequest`` of a sampling request (``SamplingParams``, the default) or a
        beam search (``BeamSearchParams``); ``priority`` (vLLM's), ``tenant`` and
        ``deadline`` (``time.monotonic()``'s clock) whatever its kind, and the LoRA adapter
        ``lora_id`` it runs under (registered by the engine). A prompt dict may carry
        ``cache_salt`` (vLLM's)."""
        params = params or SamplingParams()
        if not isinstance(params, (SamplingParams, BeamSearchParams)):
            raise ValueError(f"sampling_params must be a SamplingParams or BeamSearchParams, "
                             f"got {type(params).__name__}")
        text, token_ids = tokenize_prompt(prompt, self.tokenizer, self.vocab_size)
        if isinstance(params, SamplingParams):
            token_ids = params.truncated_prompt(token_ids, self.max_model_len)
        self._check_room(len(token_ids))
        params.verify_for_model(self.vocab_size, self.max_model_len, len(token_ids))
        compiled, bad_words = None, ()
        if isinstance(params, SamplingParams) and params.bad_words:
            bad_words = bad_words_token_ids(params.bad_words, self.tokenizer, self.vocab_size)
        if isinstance(params, BeamSearchParams):
            params.verify_kv_capacity(len(token_ids), self.num_kv_blocks, self.block_size)
        elif params.structured_outputs is not None:
            compiled = self.grammar_compiler.compile(params.structured_outputs)
        return EngineRequest(request_id, tuple(token_ids), params, self.eos_token_ids,
                             compiled, priority=priority, tenant=tenant, deadline=deadline,
                             cache_salt=prompt_cache_salt(prompt), lora_id=lora_id,
                             prompt=text, bad_words_token_ids=bad_words)

    def _check_room(self, prompt_len: int) -> None:
        """A prompt must leave room for at least one generated token."""
        if prompt_len < self.max_total_tokens:
            return
        limit = ("the model's context (max_model_len=%d)" % self.max_model_len
                 if self.max_total_tokens == self.max_model_len else
                 "the KV cache (%d tokens; raise kv_cache_memory or num_kv_blocks)"
                 % self.max_total_tokens)
        raise ValueError(
            f"prompt is too long: {prompt_len} tokens, but {limit} leaves room for at most "
            f"{self.max_total_tokens - 1} prompt tokens plus one generated token; shorten the prompt")
