"""``LoRARequest``: which adapter a request runs under (vLLM's class and field names)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..exceptions import ParamValidationError


@dataclass(frozen=True)
class LoRARequest:
    """A PEFT adapter folder ``lora_path`` known as ``lora_name``; ``lora_int_id`` (>= 1)
    identifies it in the engine: two requests with the same id share its weights and their
    cached prefixes. Invariant: one id names one adapter for the engine's life (re-adding an
    id with another name or path is refused)."""

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ParamValidationError(f"lora_name must be a non-empty string, got "
                                       f"{self.lora_name!r}", "lora_request")
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int) \
                or self.lora_int_id < 1:
            raise ParamValidationError(f"lora_int_id must be an integer >= 1, got "
                                       f"{self.lora_int_id!r}", "lora_request")
        if not isinstance(self.lora_path, str) or not os.path.isdir(self.lora_path):
            raise ParamValidationError(f"lora_path {self.lora_path!r} is not a folder: give a "
                                       f"PEFT adapter folder (adapter_config.json and "
                                       f"adapter_model.safetensors)", "lora_request")
