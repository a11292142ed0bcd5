"""``LoRAConfig``: multi-LoRA serving (vLLM's names; ``paged_core.lora``)."""
from __future__ import annotations

from dataclasses import dataclass

from .setting_values import check_positive


@dataclass
class LoRAConfig:
    """``enable_lora`` lets requests run under PEFT adapters (``lora_request``); up to
    ``max_loras`` adapters are resident at once (one slot each, on the model's device) and
    share a step, and ``max_cpu_loras`` (default: ``max_loras``) stay loaded in host memory;
    a request whose adapter has no slot waits until one frees (least recently used first).
    Adapters may have any rank up to ``max_lora_rank``."""

    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.enable_lora, bool):
            raise ValueError(f"enable_lora must be true or false, got {self.enable_lora!r}")
        check_positive("max_loras", self.max_loras)
        check_positive("max_lora_rank", self.max_lora_rank)
        if self.max_cpu_loras is None:
            self.max_cpu_loras = self.max_loras
        check_positive("max_cpu_loras", self.max_cpu_loras)
        if self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be at least "
                             f"max_loras ({self.max_loras})")
