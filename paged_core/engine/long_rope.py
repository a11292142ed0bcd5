"""LongRoPE as transformers runs it: its Phi-3 ``generate`` drops its cache once a sequence
grows past the switch (``models.spec.long_rope_switch``) and computes every token again,
rotated with the long factors; the engine core does the same before each step."""
from __future__ import annotations

from ..core.kv_cache_manager import KVCacheManager
from ..core.sequence import Sequence


def rotate_long(running: list[Sequence], kv: KVCacheManager, switch: int) -> None:
    """A running sequence whose keys were rotated with the short factors and that now holds
    more than ``switch`` tokens computes all of them again, rotated with the long factors
    (its short blocks stay cached for sequences that stay short); drafts never cross the
    switch of a sequence still short."""
    for seq in running:
        if seq.rotated_long:
            continue
        if seq.num_tokens > switch:
            kv.free(seq)
            seq.num_computed_tokens, seq.rotated_long = 0, True
            seq.block_hashes, seq.spec_token_ids = [], []
        else:
            del seq.spec_token_ids[switch - seq.num_tokens:]
