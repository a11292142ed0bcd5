"""``SamplingPlan``: what the sampler does in one step, laid out once.

The runner returns logits for the rows ``execute_model`` asked for
(``StepInput.needs_logits``), in scheduling order: one per sampled sequence, plus
one per draft token it carries. The plan names, for each sample the sampler
draws (a sequence, and each sample a fork of it just made), its
``SamplingRow``s (one per verified position) and the logits rows they read, so
a forked sample reads its parent's row and the logits are selected at most once.

Invariant: ``len(rows) == len(logit_rows)``; the rows of ``targets[i]`` come
after those of ``targets[i - 1]``, ``1 + len(targets[i].spec_token_ids)`` of them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..core.sequence import Sequence
from ..request import Request
from .sampler import SamplingRow
from ..spec_decode.rejection_sampler import verify_rows


@dataclass
class SamplingPlan:
    rows: list[SamplingRow] = field(default_factory=list)
    targets: list[Sequence] = field(default_factory=list)
    logit_rows: list[int] = field(default_factory=list)

    def add(self, request: Request, target: Sequence, logit_row: int) -> None:
        """Sample ``target`` from the logits rows starting at ``logit_row``: one row, or one
        per position its drafts are verified at."""
        target_rows = verify_rows(request, target) if target.spec_token_ids \
            else [request.sampling_row(target)]
        self.rows += target_rows
        self.targets.append(target)
        self.logit_rows += range(logit_row, logit_row + len(target_rows))

    def select(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits rows in plan order (``logits`` itself when nothing forked)."""
        if len(self.logit_rows) == logits.shape[0]:
            return logits
        return logits[torch.tensor(self.logit_rows, device=logits.device)]
