"""Which token ids end generation: the generation config's and the model config's EOS ids."""
from __future__ import annotations

import os


def eos_token_ids(folder: str, hf_config, tokenizer) -> frozenset[int]:
    ids: set[int] = set()
    for source in (_generation_config(folder), hf_config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    if not ids and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def _generation_config(folder: str):
    if not os.path.exists(os.path.join(folder, "generation_config.json")):
        return None
    from transformers import GenerationConfig
    return GenerationConfig.from_pretrained(folder)
