"""Tiny random models whose output stays inside a small slice of the vocabulary.

A random tiny model spreads its greedy output over the whole vocabulary, so an
n-gram lookup would never find a match. Here the LM head keeps (scaled up) only
the rows of ``NARROW`` tokens and zeroes the others: every greedy token is one of
32, so prompts and outputs drawn from them repeat n-grams often, some drafts are
accepted and many are rejected. The draft model is the target with noise on
its LM head: it agrees with the target often, not always.
"""
from __future__ import annotations

import torch

from ..tiny_models import build_tiny_model

NARROW = range(1000, 1032)


def build_narrow_model(folder: str, tokenizer, noise: float = 0.0) -> str:
    from transformers import AutoModelForCausalLM

    build_tiny_model("llama", folder, tokenizer)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    keep = torch.tensor(list(NARROW))
    with torch.no_grad():
        weight = model.lm_head.weight
        kept = weight[keep] * 8
        if noise:
            kept += noise * torch.randn(kept.shape, generator=torch.Generator().manual_seed(7))
        weight.zero_()
        weight[keep] = kept
    model.save_pretrained(folder)
    return folder


def narrow_prompts(lengths: list[int], seed: int = 0) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    return [{"prompt_token_ids": torch.randint(NARROW.start, NARROW.stop, (n,),
                                               generator=generator).tolist()} for n in lengths]
