"""The CPU KV cache is zeros on 2 MiB pages wherever the kernel grants them."""
import sys
from pathlib import Path

import pytest
import torch

from paged_core.cpu.huge_pages import HUGE_PAGE, zeros_on_huge_pages


def _thp_mode() -> str | None:
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not path.exists():
        return None
    return path.read_text().split("[")[1].split("]")[0]


def _vm_flags(address: int) -> set[str]:
    """The VmFlags of the mapping holding ``address`` (from /proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        first = line.split()[0]
        if "-" in first and ":" not in first:
            start, end = (int(x, 16) for x in first.split("-"))
            inside = start <= address < end
        elif inside and first == "VmFlags:":
            return set(line.split()[1:])
    return set()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zeros_with_the_asked_shape_and_dtype(dtype):
    for shape in ((3, 700, 16, 64), (2, 3)):  # over and under one huge page
        t = zeros_on_huge_pages(shape, dtype)
        assert t.shape == shape and t.dtype == dtype and t.is_contiguous()
        assert not t.any()
        t.fill_(1)  # writable, and the whole span is the tensor's own
        assert (t == 1).all()


@pytest.mark.skipif(not sys.platform.startswith("linux") or _thp_mode() in (None, "never"),
                    reason="needs Linux with transparent huge pages in madvise or always mode")
def test_the_memory_is_advised_onto_huge_pages():
    """Whether the kernel then grants 2 MiB pages depends on its free memory and
    fragmentation at that moment, so what is asserted is the advice ("hg" flag)."""
    t = zeros_on_huge_pages((64 * HUGE_PAGE // 2,), torch.bfloat16)  # 64 MiB
    assert t.data_ptr() % HUGE_PAGE == 0
    assert "hg" in _vm_flags(t.data_ptr())


def test_engines_keep_their_kv_cache_on_huge_pages_on_cpu():
    from paged_core import LLM

    runner = LLM(dtype="bfloat16", kv_cache_memory="256MiB").engine.core.executor.runner
    k_cache = runner.kv_caches[0][0]
    assert k_cache.data_ptr() % HUGE_PAGE == 0 and not k_cache.any()
