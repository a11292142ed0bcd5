"""Chained block hashes for automatic prefix caching.

``hash(block i) = H(hash(block i-1) || token ids of block i)`` with a stable
cryptographic hash (blake2b), never Python's salted ``hash()``: two processes,
or two requests, with the same prefix get the same chain. The chain starts from
``ROOT_HASH``, or from a hash of it and the request's cache salt (vLLM's
``cache_salt``): requests share cached blocks only when their salts are equal.
"""
from __future__ import annotations

import hashlib
from array import array
from typing import Sequence

ROOT_HASH = b"paged-core-root"


def hash_block(parent_hash: bytes | None, token_ids: Sequence[int]) -> bytes:
    digest = hashlib.blake2b(parent_hash or ROOT_HASH, digest_size=16)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


def salted_root(salt: str | None) -> bytes | None:
    """The parent hash of a chain's first block: ``None`` (``ROOT_HASH``) without a salt."""
    if salt is None:
        return None
    return hashlib.blake2b(ROOT_HASH + b"/salt/" + salt.encode("utf-8"), digest_size=16).digest()


def extend_block_hashes(hashes: list[bytes], token_ids: Sequence[int], block_size: int,
                        salt: str | None = None, num_blocks: int | None = None) -> None:
    """Append the hashes of every full block of ``token_ids`` (of its first ``num_blocks``
    blocks, if given) not hashed yet (in place)."""
    num_full = len(token_ids) // block_size if num_blocks is None else num_blocks
    for i in range(len(hashes), num_full):
        parent = hashes[i - 1] if i > 0 else salted_root(salt)
        hashes.append(hash_block(parent, token_ids[i * block_size:(i + 1) * block_size]))
