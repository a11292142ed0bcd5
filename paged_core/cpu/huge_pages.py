"""The KV cache on the CPU in 2 MiB pages (Linux transparent huge pages).

Attention reads each sequence's KV blocks from all over a pool of hundreds of MiB:
on 4 KiB pages nearly every block is a TLB miss and a page walk. Linux often runs
transparent huge pages in ``madvise`` mode (``/sys/kernel/mm/transparent_hugepage/
enabled``), where memory gets 2 MiB pages only if the program asks, so
``zeros_on_huge_pages`` asks: it takes untouched memory, advises
``MADV_HUGEPAGE`` on its 2 MiB-aligned span, then zero-fills it (the first touch
faults the pages in). Measured on the 2-core AVX512-BF16 EPYC: decode attention
15-50% faster. Where the advice cannot be given (not Linux, THP ``never``, a
kernel that refuses) the tensor is the same zeros on ordinary pages.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import sys

import torch

HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14


def zeros_on_huge_pages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A contiguous CPU tensor of zeros whose memory was advised onto huge pages (see above)."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    libc = _libc()
    if libc is None or nbytes < HUGE_PAGE:
        return torch.zeros(shape, dtype=dtype)
    raw = torch.empty(nbytes + HUGE_PAGE, dtype=torch.uint8)
    offset = -raw.data_ptr() % HUGE_PAGE
    span = nbytes // HUGE_PAGE * HUGE_PAGE
    libc.madvise(ctypes.c_void_p(raw.data_ptr() + offset), ctypes.c_size_t(span), _MADV_HUGEPAGE)
    tensor = raw[offset:offset + nbytes].view(dtype).view(shape)
    return tensor.zero_()


@functools.lru_cache(maxsize=1)
def _libc():
    """The C library with ``madvise``, on Linux; else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    libc.madvise.restype = ctypes.c_int
    return libc
