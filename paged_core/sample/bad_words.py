"""``bad_words`` (vLLM's ``SamplingParams`` field): words a request must never generate.

A word becomes the token ids of its spellings (``bad_words_token_ids``): as it is
tokenized at the start of a text and, where that gives a different spelling of the same
length, after a space (the form it takes inside a sentence), as vLLM spells them. At each
step the sampler may not take the last token of a spelling whose other tokens end the
sample's output so far (``banned_tokens``), so no spelling is ever completed; a one-token
spelling is never generated at all. Only output tokens count, as in vLLM: a spelling that
would begin in the prompt is not banned, and other tokenizations of the same text (a word
split differently) are not either.
"""
from __future__ import annotations

from collections.abc import Sequence

from ..exceptions import ParamValidationError

Spellings = tuple[tuple[int, ...], ...]


def bad_words_token_ids(words: Sequence[str], tokenizer, vocab_size: int) -> Spellings:
    """The token ids of each word's spellings (see the module docstring); raises
    ``ParamValidationError`` naming ``bad_words`` for a word with no tokens or a token
    outside the model's vocabulary."""
    spellings: list[tuple[int, ...]] = []
    for word in words:
        bare = tuple(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        if not bare:
            raise ParamValidationError(f"bad_words must hold words with tokens, got {word!r}",
                                       "bad_words")
        spellings.append(bare)
        spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        if spaced and spaced[0] != bare[0] and len(spaced) == len(bare):
            spellings.append(spaced)
    for spelling in spellings:
        if max(spelling) >= vocab_size:
            raise ParamValidationError(
                f"bad_words must be words the model can generate: {spelling} has a token id "
                f">= the model's vocabulary size ({vocab_size})", "bad_words")
    return tuple(spellings)


def banned_tokens(spellings: Spellings, output: Sequence[int]) -> list[int]:
    """The last token of every spelling whose other tokens end ``output`` (output token ids
    only), in order, without repeats."""
    banned: list[int] = []
    for spelling in spellings:
        before = len(spelling) - 1
        if before > len(output):
            continue
        if (before == 0 or tuple(output[-before:]) == spelling[:-1]) and spelling[-1] not in banned:
            banned.append(spelling[-1])
    return banned
