"""Multi-LoRA serving: many PEFT adapters over one base model, mixed in one batch.

- ``request.LoRARequest``: vLLM's handle of an adapter (name, id, path);
- ``config.LoRAConfig``: ``enable_lora``, ``max_loras``, ``max_lora_rank``, ``max_cpu_loras``;
- ``peft_checkpoint``: reads and checks a PEFT adapter folder against the base model;
- ``layers``: ``LoRALinear`` adds each row's adapter product to a base projection, batched
  per adapter (the rows of one adapter in one pair of GEMMs, Punica's segment idea);
- ``runtime.LoRARuntime``: a rank's ``max_loras`` device-resident slots and its host cache.

Which adapter holds which slot is decided in the core (``core.lora_slots``), which never
evicts an adapter that a running sequence uses; block hashes are salted by adapter.
"""
from .request import LoRARequest

__all__ = ["LoRARequest"]
