"""PEFT LoRA adapters for the tests, made with PEFT itself: random ``lora_A`` (PEFT's init)
and random non-zero ``lora_B`` (PEFT starts it at zero, which would change nothing)."""
from __future__ import annotations

import torch

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(base_folder: str, folder: str, rank: int, seed: int,
                 target_modules: list[str] | None = None, alpha: int | None = None,
                 use_rslora: bool = False, scale: float = 0.3) -> str:
    """Save a PEFT adapter of ``rank`` over the model in ``base_folder`` into ``folder``."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=alpha or 2 * rank, use_rslora=use_rslora,
                        target_modules=target_modules or ALL_MODULES, lora_dropout=0.0)
    torch.manual_seed(seed)
    model = get_peft_model(base, config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, scale)
    model.save_pretrained(folder)
    return folder


def peft_model(base_folder: str, adapter_folder: str):
    """transformers' model with the adapter applied by PEFT (the oracle), float32."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
    return PeftModel.from_pretrained(base, adapter_folder).eval()
