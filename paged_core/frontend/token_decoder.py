"""``token_decoder``: the cheapest call that turns token ids into the text
``tokenizer.decode(ids, skip_special_tokens=...)`` returns.

The detokenizer decodes twice per generated token, so a step of 256 sequences makes 512
``decode`` calls; transformers' ``decode`` spends most of its time converting and checking
its arguments in Python before one call into the Rust ``tokenizers`` library. Where that
call is all the tokenizer adds (a ``TokenizersBackend`` whose ``decode``/``_decode`` no
subclass overrides, with no space clean-up), this calls the library directly.

Invariant: for every list of ids, the returned function gives the string
``tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)`` gives.
"""
from __future__ import annotations

from collections.abc import Callable

TokenDecoder = Callable[[list[int]], str]


def token_decoder(tokenizer, skip_special_tokens: bool) -> TokenDecoder:
    """A function of a list of token ids returning ``tokenizer``'s text for them."""
    backend = _plain_backend(tokenizer)
    if backend is not None:
        def decode_in_backend(ids: list[int]) -> str:
            return backend.decode(ids, skip_special_tokens=skip_special_tokens)
        return decode_in_backend

    def decode_by_tokenizer(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    return decode_by_tokenizer


def _plain_backend(tokenizer):
    """The Rust tokenizer behind ``tokenizer`` when its ``decode`` is exactly the backend's
    ``decode`` (no override, no clean-up of spaces); else ``None``."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers layout: keep its own decode
        return None
    kind = type(tokenizer)
    if not (isinstance(tokenizer, TokenizersBackend)
            and kind.decode is PreTrainedTokenizerBase.decode
            and kind._decode is TokenizersBackend._decode
            and not getattr(tokenizer, "clean_up_tokenization_spaces", False)):
        return None
    return getattr(tokenizer, "_tokenizer", None)
