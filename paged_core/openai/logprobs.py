"""Engine logprobs -> the two OpenAI logprob formats.

The engine gives, per generated token, ``{token_id: Logprob(logprob, rank,
decoded_token)}`` holding the sampled token and the top-k alternatives. Top
lists are ordered by rank and hold at most ``k`` entries; the sampled token's
own logprob is always reported.
"""
from __future__ import annotations

from typing import Any

from paged_core.outputs import Logprob


def _top(entry: dict[int, Logprob], k: int) -> list[Logprob]:
    return sorted(entry.values(), key=lambda lp: lp.rank)[:k]


def _sampled(entry: dict[int, Logprob], token_id: int) -> Logprob | None:
    return entry.get(token_id)


def completion_logprobs(token_ids: list[int], entries: list[dict[int, Logprob]] | None,
                        k: int, text_offset: int) -> dict[str, Any] | None:
    """``/v1/completions`` format: parallel ``tokens`` / ``token_logprobs`` / ``top_logprobs``."""
    if entries is None:
        return None
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    for token_id, entry in zip(token_ids, entries):
        lp = _sampled(entry, token_id)
        text = lp.decoded_token if lp is not None else ""
        tokens.append(text)
        token_logprobs.append(lp.logprob if lp is not None else None)
        top_logprobs.append({t.decoded_token: t.logprob for t in _top(entry, k)} if k else None)
        offsets.append(text_offset)
        text_offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs,
            "top_logprobs": top_logprobs, "text_offset": offsets}


def _chat_item(lp: Logprob) -> dict[str, Any]:
    return {"token": lp.decoded_token, "logprob": lp.logprob,
            "bytes": list(lp.decoded_token.encode("utf-8"))}


def chat_logprobs(token_ids: list[int], entries: list[dict[int, Logprob]] | None,
                  k: int) -> dict[str, Any] | None:
    """``/v1/chat/completions`` format: ``{"content": [{token, logprob, bytes, top_logprobs}]}``."""
    if entries is None:
        return None
    content = []
    for token_id, entry in zip(token_ids, entries):
        lp = _sampled(entry, token_id)
        item = _chat_item(lp) if lp is not None else {"token": "", "logprob": None, "bytes": []}
        item["top_logprobs"] = [_chat_item(t) for t in _top(entry, k)]
        content.append(item)
    return {"content": content}
