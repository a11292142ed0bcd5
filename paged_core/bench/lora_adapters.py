"""PEFT LoRA adapters made with PEFT itself, for ``bench lora`` and the tests: PEFT's random
``lora_A`` and a random non-zero ``lora_B`` (PEFT starts it at zero, which changes nothing).
Needs ``peft`` (the ``dev`` and ``bench`` extras)."""
from __future__ import annotations

import os

import torch

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapters(base_folder: str, out_dir: str, rank: int, seeds: list[int],
                  target_modules: list[str] | None = None, alpha: int | None = None,
                  use_rslora: bool = False, scale: float = 0.3) -> list[str]:
    """One adapter folder per seed under ``out_dir`` (``r<rank>-s<seed>``), all of ``rank``
    over the model in ``base_folder``; the base is loaded once."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=alpha or 2 * rank, use_rslora=use_rslora,
                        target_modules=target_modules or ALL_MODULES, lora_dropout=0.0)
    model = get_peft_model(base, config)
    folders = []
    for seed in seeds:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_A" in name or "lora_B" in name:
                    std = scale if "lora_B" in name else param.shape[1] ** -0.5
                    param.copy_(torch.randn(param.shape, generator=generator) * std)
        folder = os.path.join(out_dir, f"r{rank}-s{seed}")
        model.save_pretrained(folder)
        folders.append(folder)
    return folders
