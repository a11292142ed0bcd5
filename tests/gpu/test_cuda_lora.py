"""Multi-LoRA on CUDA: one float32 batch mixing three adapters and the base model, its LoRA
products in the Triton kernels (``kernels/lora.py``), equals PEFT over transformers on the CPU
token for token (the CPU tier's cases, ``tests/lora/test_lora_parity.py``)."""
from paged_core import LLM

from ..lora.test_lora_parity import adapters, base, check, expected, prompts  # noqa: F401


def test_mixed_adapters_match_peft(base, adapters, prompts, expected):  # noqa: F811
    llm = LLM(model=base, device="cuda", dtype="float32", num_kv_blocks=96, enable_lora=True,
              max_loras=3, max_lora_rank=16)
    wrappers = llm.engine.core.executor.runner.lora.wrappers
    assert {wrapper.products.name for _, _, wrapper in wrappers} == {"triton"}
    check(llm, prompts, adapters, expected)
    llm.shutdown()
