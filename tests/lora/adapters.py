"""Test adapters (``paged_core.bench.lora_adapters``) and the oracle: PEFT over transformers."""
from __future__ import annotations

import os
import shutil

import torch

from paged_core.bench.lora_adapters import make_adapters


def make_adapter(base_folder: str, folder: str, rank: int, seed: int, **options) -> str:
    """One PEFT adapter of ``rank`` over the model in ``base_folder``, saved in ``folder``."""
    (made,) = make_adapters(base_folder, folder + ".parts", rank, [seed], **options)
    shutil.move(made, folder)
    os.rmdir(folder + ".parts")
    return folder


def peft_model(base_folder: str, adapter_folder: str, dtype: torch.dtype = torch.float32):
    """transformers' model with the adapter applied by PEFT (the oracle), in ``dtype``."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_folder, dtype=dtype)
    return PeftModel.from_pretrained(base, adapter_folder).eval()
