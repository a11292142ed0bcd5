"""Helpers for correctness tests: greedy reference generation with transformers, and prompts."""
from __future__ import annotations

import torch

PASSAGE = (
    "The history of paged memory begins with the Atlas computer in Manchester, where a small "
    "fast store and a large slow drum were combined so that programs saw one large address "
    "space. Pages moved between the two levels on demand, and a table mapped every virtual page "
    "to the frame that held it. Decades later the same idea returned in language model serving: "
    "the attention keys and values of every request are cut into fixed-size blocks, a block "
    "table maps each logical block to a physical one, and memory is handed out only when a "
    "sequence grows into a new block. Sharing follows naturally, because two sequences may point "
    "at the same physical block and copy it only when one of them writes. "
)


def passage_token_ids(tokenizer, num_tokens: int, offset: int = 0) -> list[int]:
    """``num_tokens`` real-text token ids, starting ``offset`` tokens into a repeated passage."""
    ids = tokenizer.encode(PASSAGE * 8)
    return ids[offset:offset + num_tokens]


@torch.no_grad()
def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation by ``transformers.generate`` of one unpadded prompt.

    EOS does not stop it (like ``ignore_eos=True``) and is not suppressed either.
    """
    ids = torch.tensor([prompt_ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), eos_token_id=[],
                         max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()
