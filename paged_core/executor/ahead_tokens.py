"""``AheadTokens``: the rows of a step whose input token the host does not know yet.

Under ``schedule_ahead`` a step is launched before the previous step's sampled tokens reach
the host (``engine_core``): a sequence decoding the token it sampled there reads it from
that step's token tensor, on the device, after its other inputs are in place. Invariant:
``rows`` and ``sources`` have one entry per such row; ``tokens`` is the previous step's
sampled token ids (one per sampled row, on the step's device).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AheadTokens:
    rows: list[int]  # rows of the step's input ids
    sources: list[int]  # for each, its row in ``tokens``
    tokens: torch.Tensor

    def write_into(self, input_ids: torch.Tensor) -> None:
        """Put each row's token into ``input_ids`` (on its device); the index copies do not
        wait for the kernels queued before them (they come from host memory)."""
        device = input_ids.device
        rows = torch.tensor(self.rows, dtype=torch.int64).to(device, non_blocking=True)
        sources = torch.tensor(self.sources, dtype=torch.int64).to(device, non_blocking=True)
        input_ids[rows] = self.tokens[sources].to(input_ids.dtype)
