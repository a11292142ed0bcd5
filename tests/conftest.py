"""Shared fixtures: the embedded model, a Hugging Face reference, tiny random models.

Environment set before anything imports torch or triton: Triton runs in its
interpreter on CPU, and OpenMP threads sleep when idle (this machine is shared).
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def embedded_folder():
    from paged_core.embedded_model import embedded_model_folder
    return embedded_model_folder()


@pytest.fixture(scope="session")
def hf_embedded(embedded_folder):
    """The embedded model loaded by transformers in float32: the correctness oracle."""
    import torch
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(embedded_folder, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tokenizer(embedded_folder):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(embedded_folder)


@pytest.fixture(scope="session")
def llm_fp32():
    """One shared fp32 engine on the embedded model (tests must leave it idle)."""
    from paged_core import LLM
    return LLM(dtype="float32", kv_cache_memory="256MiB")
