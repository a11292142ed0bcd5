"""``LoRASlotTable``: which adapter holds each of the ``max_loras`` device slots (no torch).

The scheduler asks ``admit`` before it starts a sequence: its adapter is resident, or takes
a free slot, or takes the slot of the least recently used adapter that no running sequence
uses. Otherwise the sequence waits (it is not refused): a slot frees when the last running
sequence of some adapter finishes or is preempted. Every assignment is recorded once in
``pending_loads`` for the step that first runs it (the workers copy the weights in before
that step's forward). Invariants: an adapter in use by a running sequence keeps its slot;
``slot_of`` and ``free`` together hold each slot exactly once.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Collection


class LoRASlotTable:
    def __init__(self, max_loras: int) -> None:
        self.free = list(range(max_loras))
        self.slot_of: OrderedDict[int, int] = OrderedDict()  # lora_id -> slot, LRU first
        self.pending_loads: list[tuple[int, int]] = []  # (slot, lora_id) not yet sent

    def admit(self, lora_id: int | None, in_use: Callable[[], Collection[int | None]]) -> bool:
        """Make ``lora_id`` resident if it is not (``None``: the base model, always); False
        when every slot holds an adapter in ``in_use()`` (the adapters of running sequences,
        asked for only when a slot must be taken from another adapter)."""
        if lora_id is None:
            return True
        if lora_id in self.slot_of:
            self.slot_of.move_to_end(lora_id)
            return True
        if self.free:
            slot = self.free.pop(0)
        else:
            busy = in_use()
            victim = next((held for held in self.slot_of if held not in busy), None)
            if victim is None:
                return False
            slot = self.slot_of.pop(victim)
        self.slot_of[lora_id] = slot
        self.pending_loads.append((slot, lora_id))
        return True

    def slot(self, lora_id: int | None) -> int:
        """The slot of a resident adapter; -1 for the base model."""
        return -1 if lora_id is None else self.slot_of[lora_id]

    def take_loads(self) -> list[tuple[int, int]]:
        loads, self.pending_loads = self.pending_loads, []
        return loads

    def release(self, lora_id: int) -> None:
        """Forget ``lora_id`` (removed from the engine; no sequence may use it)."""
        if lora_id in self.slot_of:
            self.free.append(self.slot_of.pop(lora_id))
            self.pending_loads = [(s, i) for s, i in self.pending_loads if i != lora_id]
