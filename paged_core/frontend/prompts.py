"""Prompt inputs as vLLM accepts them: a string, a list of token ids, or a dict
(``{"prompt_token_ids": [...]}`` or ``{"prompt": "..."}``, either with an optional
``cache_salt``)."""
from __future__ import annotations

from typing import Any, Union

from ..param_checks import lone_surrogate_message

PromptInput = Union[str, list[int], dict[str, Any]]


def check_text(name: str, text: str) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``text`` is valid Unicode (encodable as
    UTF-8): tokenizers reject lone surrogates, so they are refused before tokenization."""
    message = lone_surrogate_message(name, text)
    if message is not None:
        raise ValueError(message)


def _encode(text: Any, tokenizer) -> list[int]:
    if not isinstance(text, str):
        raise ValueError(f"prompt must be a string, got {type(text).__name__}")
    check_text("prompt", text)
    return tokenizer.encode(text)


def tokenize_prompt(prompt: PromptInput, tokenizer,
                    vocab_size: int | None) -> tuple[str | None, list[int]]:
    """Return ``(text or None, token ids)``; raises ``ValueError`` for an unusable prompt
    (given token ids must lie in ``[0, vocab_size)``: any non-negative id if it is ``None``)."""
    if isinstance(prompt, str):
        text, token_ids = prompt, _encode(prompt, tokenizer)
    elif isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            text, token_ids = prompt.get("prompt"), prompt["prompt_token_ids"]
        elif "prompt" in prompt:
            text, token_ids = prompt["prompt"], _encode(prompt["prompt"], tokenizer)
        else:
            raise ValueError("a prompt dict needs 'prompt_token_ids' or 'prompt'")
    elif isinstance(prompt, (list, tuple)):
        text, token_ids = None, prompt
    else:
        raise ValueError(f"a prompt must be a string, a list of token ids or a dict, "
                         f"got {type(prompt).__name__}")
    if not isinstance(token_ids, (list, tuple)):
        raise ValueError(f"prompt_token_ids must be a list of integers, got {type(token_ids).__name__}")
    token_ids = list(token_ids)
    if not token_ids:
        raise ValueError("prompt is empty: give at least one token")
    for t in token_ids:
        if isinstance(t, bool) or not isinstance(t, int) or t < 0 or \
                (vocab_size is not None and t >= vocab_size):
            bound = "non-negative" if vocab_size is None else f"in [0, {vocab_size})"
            raise ValueError(f"prompt_token_ids must be integers {bound}, got {t!r}")
    return text, token_ids


def prompt_cache_salt(prompt: PromptInput) -> str | None:
    """A prompt dict's ``cache_salt`` (vLLM's: prefix-cache hits only between requests with
    the same salt), else ``None``; checked by ``EngineRequest``."""
    return prompt.get("cache_salt") if isinstance(prompt, dict) else None


def is_single_prompt(prompts: Any) -> bool:
    """True if ``prompts`` is one prompt rather than a list of prompts."""
    if isinstance(prompts, (str, dict)):
        return True
    return isinstance(prompts, (list, tuple)) and bool(prompts) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompts)
