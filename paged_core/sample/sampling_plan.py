"""``SamplingPlan``: what the sampler does in one step, laid out before the forward; and
``SamplerOutput``, what the executor returns for it.

The runner computes logits for the rows the step asked for (``StepInput.needs_logits``),
in scheduling order: one per sampled sequence, plus one per draft token it carries. The
plan names, for each sample the sampler draws (a sequence, and each sample its request
forks from it right after the prompt), its ``SamplingRow``s (one per verified position)
and the logits rows they read, so a forked sample reads its parent's row and the logits
are selected at most once; and the sequences whose raw logits row goes back to their
request instead (``keep_logits``: beam search ranks whole continuations itself).

Invariants: ``len(rows) == len(logit_rows)``; the rows of ``targets[i]`` come after those
of ``targets[i - 1]``, ``1 + len(targets[i].spec_token_ids)`` of them;
``len(kept) == len(kept_rows)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..core.sequence import Sequence
from ..requests.sampling_request import Request
from ..spec_decode.rejection_sampler import verify_rows
from .pending_tokens import PendingTokens
from .sampler import Sampler, SamplingRow, TokenLogprobs


@dataclass
class SamplerOutput:
    """The step's sampled tokens and log-probabilities (one per plan row, in plan order) and
    the raw logits rows the plan kept (``[len(kept), vocab]`` float32, or None). The token
    ids may still be on their way from the GPU (``PendingTokens``) until ``wait``."""

    token_ids: list[int] | PendingTokens
    logprobs: list[TokenLogprobs | None]
    kept_logits: torch.Tensor | None

    def wait(self) -> "SamplerOutput":
        """This output with its token ids on the host (blocks until the device has them)."""
        if isinstance(self.token_ids, PendingTokens):
            self.token_ids = self.token_ids.tolist()
        return self


@dataclass
class SamplingPlan:
    rows: list[SamplingRow] = field(default_factory=list)
    targets: list[Sequence] = field(default_factory=list)
    logit_rows: list[int] = field(default_factory=list)
    kept: list[Sequence] = field(default_factory=list)
    kept_rows: list[int] = field(default_factory=list)

    def add(self, request: Request, target: Sequence, logit_row: int) -> None:
        """Sample ``target`` from the logits rows starting at ``logit_row``: one row, or one
        per position its drafts are verified at."""
        target_rows = verify_rows(request, target) if target.spec_token_ids \
            else [request.sampling_row(target)]
        self.rows += target_rows
        self.targets.append(target)
        self.logit_rows += range(logit_row, logit_row + len(target_rows))

    def keep_logits(self, seq: Sequence, logit_row: int) -> None:
        """Hand ``seq``'s raw logits row back (``SamplerOutput.kept_logits``)."""
        self.kept.append(seq)
        self.kept_rows.append(logit_row)

    def run(self, sampler: Sampler, logits: torch.Tensor) -> SamplerOutput:
        """Sample every planned row of ``logits`` (the runner's rows) in one call;
        the token ids may still be on the device (``SamplerOutput.wait``)."""
        tokens, logprobs = sampler.launch(_rows(logits, self.logit_rows), self.rows) \
            if self.rows else ([], [])
        kept = _rows(logits, self.kept_rows).float() if self.kept else None
        return SamplerOutput(tokens, logprobs, kept)


def _rows(logits: torch.Tensor, index: list[int]) -> torch.Tensor:
    """``logits[index]`` (``logits`` itself when that selects every row in order)."""
    if index == list(range(logits.shape[0])):
        return logits
    return logits[torch.tensor(index, device=logits.device)]
