"""The GPU tier: the engine and its Triton kernels on a real NVIDIA GPU.

Every test here skips, saying why, unless CUDA is available and ``TRITON_INTERPRET=0``
is set (the root ``conftest`` defaults it to the CPU interpreter). They run as part of
``benchmarks/gpu_suite.py``'s correctness section on a GPU machine, where there is no
model hub: ``PAGED_CORE_TEST_TOKENIZER`` may name a folder holding only the embedded
model's tokenizer files, carried along instead of the whole model.
"""
import os

import pytest
import torch


def cuda_skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "needs an NVIDIA GPU: torch.cuda.is_available() is False on this machine"
    if os.environ.get("TRITON_INTERPRET", "0") != "0":
        return "set TRITON_INTERPRET=0: the Triton kernels must be compiled for the GPU"
    return None


def pytest_collection_modifyitems(config, items):
    reason = cuda_skip_reason()
    if reason is None:
        return
    for item in items:
        if item.nodeid.startswith("tests/gpu/"):
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def tokenizer(request):
    from transformers import AutoTokenizer
    folder = os.environ.get("PAGED_CORE_TEST_TOKENIZER") or request.getfixturevalue(
        "embedded_folder")
    return AutoTokenizer.from_pretrained(folder)
