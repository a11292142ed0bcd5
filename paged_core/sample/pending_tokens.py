"""``PendingTokens``: a step's sampled token ids on their way from the device to the host.

On a GPU the sampler's token ids are ready only once the step's kernels ran. Reading them at
once (``tensor.tolist()``) blocks the host until then; a ``PendingTokens`` instead starts a
non-blocking copy into pinned host memory behind the step's kernels and records an event, so
the host can do other work (``async_scheduling``: the front end's text work for the step
before) until ``tolist`` waits for that event. On the CPU the ids are already there.

Invariant: ``tolist()`` returns exactly ``tokens.tolist()`` of the tensor it was made from,
whenever it is called; ``tensor`` is that tensor, where it was made (``schedule_ahead``: the
next step's runner reads its tokens on the device).
"""
from __future__ import annotations

import torch


class PendingTokens:
    def __init__(self, tokens: torch.Tensor) -> None:
        self.tensor = tokens
        self._ready: torch.cuda.Event | None = None
        if tokens.device.type != "cuda":
            self._host = tokens
            return
        self._host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        self._host.copy_(tokens, non_blocking=True)
        self._ready = torch.cuda.Event()
        self._ready.record()

    def tolist(self) -> list[int]:
        """The token ids, once the device has produced and copied them (blocks until then)."""
        if self._ready is not None:
            self._ready.synchronize()
        return self._host.tolist()
