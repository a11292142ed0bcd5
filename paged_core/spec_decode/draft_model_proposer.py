"""``DraftModelProposer``: a small model with the target's tokenizer drafts ``k`` tokens greedily.

It runs in the engine's process on its own ``ModelRunner`` and its own paged
KV cache (as many blocks as the target's; no prefix caching), with a shadow
``Sequence`` per target sequence (same ``seq_id``) whose ``token_ids`` are the
tokens it has seen and ``num_computed_tokens`` those whose K/V its cache holds.

Per engine step, for every running sequence that may get drafts:

1. *catch up*: the shadow keeps the longest computed prefix it shares with the
   target's tokens (rejected drafts roll back, their empty blocks are freed),
   then one packed forward computes everything after it (the whole prompt the
   first time; the accepted drafts and the new token later) and its argmax is
   draft 1;
2. ``k - 1`` packed decode forwards give drafts 2..k.

All sequences share each forward. A sequence whose draft blocks do not fit is
left without drafts this step; shadows of sequences that stopped running
(finished, preempted) are freed at the next proposal.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from ..core.kv_cache_manager import KVCacheManager
from ..core.sequence import Sequence
from ..executor.group import SINGLE
from ..executor.rank_worker import RankSpec, Worker
from ..models.model_loader import load_hf_config, resolve_model_folder
from ..models.registry import model_spec
from ..executor.packed_batch import StepInput, pack_batch
from ..sample.sampler import greedy_tokens
from .config import SpeculativeConfig
from .proposer import TargetModel, draft_limit


class DraftModelProposer:
    def __init__(self, config: SpeculativeConfig, target: TargetModel) -> None:
        folder = resolve_model_folder(config.model)
        hf_config = load_hf_config(folder)
        vocab_size = model_spec(hf_config).vocab_size
        if vocab_size != target.vocab_size:
            raise ValueError(
                f"speculative_config['model'] has vocab_size {vocab_size} but the target model "
                f"has {target.vocab_size}; the draft model must use the target's tokenizer")
        context = getattr(hf_config, "max_position_embeddings", None) or 2048
        self.max_total_tokens = min(target.max_total_tokens, context)
        draft_engine_config = replace(
            target.config, model=folder, tokenizer=None, speculative_config=None,
            num_kv_blocks=target.num_blocks, tensor_parallel_size=1,
            distributed_executor_backend=None)
        worker = Worker(RankSpec(draft_engine_config, folder, self.max_total_tokens, target.device,
                                 target.dtype), SINGLE)
        self.runner = worker.runner
        self.kv = KVCacheManager(worker.num_blocks, target.config.block_size, False)
        self.k = config.num_speculative_tokens
        self.shadows: dict[int, Sequence] = {}
        self.synced: dict[int, int] = {}  # seq_id -> the target's length when last proposed for

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence]) -> None:
        """Set ``spec_token_ids`` of every running sequence (``[]`` where none fit)."""
        self._free_stopped({seq.seq_id for seq in seqs})
        limits: dict[int, int] = {}
        batch: list[tuple[Sequence, Sequence]] = []  # (target, shadow) of this step's forward
        for seq in seqs:
            seq.spec_token_ids = []
            limit = draft_limit(seq, self.k, self.max_total_tokens)
            if limit == 0:
                continue
            shadow = self._caught_up_shadow(seq)
            num_new = shadow.num_tokens - shadow.num_computed_tokens
            if self.kv.allocate_slots(shadow, num_new + limit - 1):
                limits[seq.seq_id] = limit
                batch.append((seq, shadow))
        for step in range(self.k):
            batch = [(seq, shadow) for seq, shadow in batch if limits[seq.seq_id] > step]
            if not batch:
                return
            drafts = self._forward([shadow for _, shadow in batch])
            for (seq, shadow), token in zip(batch, drafts):
                seq.spec_token_ids.append(token)
                shadow.token_ids.append(token)

    def _caught_up_shadow(self, seq: Sequence) -> Sequence:
        """The shadow of ``seq`` holding its tokens, computed up to the longest shared prefix."""
        shadow = self.shadows.get(seq.seq_id)
        if shadow is None:
            shadow = self.shadows[seq.seq_id] = Sequence(seq.seq_id, None, [], 0, 0)
        # The tokens the shadow took from ``seq`` last time are still ``seq``'s: compare after them.
        limit = min(shadow.num_computed_tokens, seq.num_tokens - 1)
        keep = min(self.synced.get(seq.seq_id, 0), limit)
        while keep < limit and shadow.token_ids[keep] == seq.token_ids[keep]:
            keep += 1
        self.synced[seq.seq_id] = seq.num_tokens
        shadow.num_computed_tokens = keep
        self.kv.free_blocks_past_computed(shadow)
        shadow.token_ids = list(seq.token_ids)
        return shadow

    def _forward(self, shadows: list[Sequence]) -> list[int]:
        """Compute every shadow's uncomputed tokens; returns each one's argmax next token."""
        batch = [StepInput(s.token_ids, s.num_computed_tokens, s.num_tokens - s.num_computed_tokens,
                           self.kv.block_ids(s), needs_logits=True) for s in shadows]
        packed = pack_batch(batch, self.kv.block_size,
                            bucketed=self.runner.model.prefers_bucketed_batches)
        logits = self.runner.execute(packed, [])
        for s in shadows:
            s.num_computed_tokens = s.num_tokens
        return greedy_tokens(logits).tolist()

    def _free_stopped(self, running: set[int]) -> None:
        for seq_id in [i for i in self.shadows if i not in running]:
            self.kv.free(self.shadows.pop(seq_id))
            self.synced.pop(seq_id, None)
