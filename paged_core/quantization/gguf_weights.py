"""A GGUF file's quantized projections as ``Int4Weight`` / ``Int8Weight``, under Hugging Face names.

Served quantized, each exactly (the stored levels, scales kept in float32; the dequantized
weight equals ``gguf.quants.dequantize``'s, which the tests check per type), the layers'
projections and the LM head (``output``, or ``token_embd`` where the file ties the two; the
embedding lookup keeps the loader's dense copy):

- Q4_0, Q4_1, Q8_0: blocks of 32 weights, a float16 scale ``d`` (Q4_1: then a float16
  minimum ``m``), then the levels: 16 bytes of nibbles (low nibbles weights 0-15, high ones
  16-31) or 32 signed bytes. Q4_0 ``d * (q - 8)`` and Q4_1 ``d * q + m`` are ``Int4Weight``
  groups of 32 (``zero = 0`` / ``m + 8 d``); Q8_0 ``d * q`` is an ``Int8Weight`` group of 32.
- Q4_K: super-blocks of 256 = 8 sub-blocks of 32 with 6-bit scales ``sc`` and minimums ``mn``
  under float16 ``d`` / ``dmin``: ``w = d * sc * q - dmin * mn``, an ``Int4Weight`` group of
  32 with ``scale = d * sc``, ``zero = 8 * scale - dmin * mn`` (both products exact in float32).
- Q6_K: super-blocks of 256 = 16 sub-blocks of 16 with signed 8-bit scales ``sc`` under a
  float16 ``d``, 6-bit levels ``q`` (4 low bits in ``ql``, 2 high ones in ``qh``):
  ``w = d * sc * (q - 32)``, an ``Int8Weight`` group of 16 with levels ``q - 32`` and
  ``scale = d * sc`` (exact in float32).
- Q5_0: blocks of 32 weights, a float16 ``d``, 4 bytes ``qh`` (bit ``j`` of the little-endian
  word: weight ``j``'s fifth bit), then 16 bytes of nibbles as Q4_0's: ``w = d * (q - 16)``,
  an ``Int8Weight`` group of 32 with levels ``q - 16`` (5-bit levels in 8-bit ones, exactly;
  llama.cpp writes Q5_0 where a K-quant's 256-weight super-blocks do not divide a row, as
  for the embedded model's 576 features in a Q4_K_M file).
- Q5_1: Q5_0's block with a float16 minimum ``m`` after ``d``: ``w = d * q + m``, an
  ``Int8Weight`` group of 32 with levels ``q`` (0..31) and zeros ``m`` (llama.cpp's fallback
  for Q5_K rows that are not whole super-blocks, so most of a 576-feature model's Q5_K_M).
- Q5_K: Q4_K's super-blocks with a fifth bit per weight (``qh``: bit ``j`` of byte ``l``,
  sub-block ``j``'s weight ``l``): ``w = d * sc * q - dmin * mn``, an ``Int8Weight`` group of
  32 with levels ``q`` (0..31), ``scale = d * sc`` and zeros ``-dmin * mn``.
- Q2_K: super-blocks of 256 = 16 sub-blocks of 16, a byte per sub-block (``sc`` in its low
  nibble, ``mn`` in its high one), 64 bytes of 2-bit fields (weight ``128 c + 32 j + l`` in
  bits ``2j`` of byte ``32 c + l``), float16 ``d`` and ``dmin``: ``w = d * sc * q - dmin *
  mn``, an ``Int4Weight`` group of 16 with levels ``q`` (0..3), ``scale = d * sc`` and
  ``zero = 8 * scale - dmin * mn`` (as Q4_K).
- Q3_K: 32 bytes ``hmask`` (bit ``b`` of byte ``l``: weight ``32 b + l``'s third bit, set
  meaning no offset), Q2_K's 64 bytes of 2-bit fields, 12 bytes of 16 packed 6-bit scales
  (``sc - 32``), float16 ``d``: ``w = d * (sc - 32) * q`` with ``q = low - 4 (1 - high)`` in
  -4..3, an ``Int4Weight`` group of 16 with levels ``q + 4`` and ``zero = 4 * scale``.
- IQ4_NL: Q4_0's block with each nibble an index into llama.cpp's table of 16 int8 values
  (``kvalues``, -127..113): ``w = d * kvalues[i]``, an ``Int8Weight`` group of 32 with the
  table's values as levels (llama-quantize's fallback for IQ4_XS rows that are not whole
  super-blocks; its Q2_K / Q3_K_M fall back to Q4_0 / Q5_0 there).
- IQ4_XS: super-blocks of 256 = 8 sub-blocks of 32, float16 ``d``, 6-bit scales ``ls - 32``
  (low nibbles in 4 bytes, 2 high bits each in a 16-bit word), then IQ4_NL's nibbles per
  sub-block: ``w = d * (ls - 32) * kvalues[i]``, an ``Int8Weight`` group of 32.
The column layout (``avx512_bf16``) keeps the 5- and 6-bit types' levels biased in bytes,
7-bit style (``Int8Linear``), and takes the zeros; the row layout adds them per group.

Served dense (widened to the model dtype by the loader, from the safetensors copy that
transformers converted the file to): the other IQ types (codebooks of several weights) and
plain floats.
``log_served`` logs one line counting, per type, the projections served quantized and dense
(a quantized part of a fused q/k/v or gate/up projection whose sibling is dense is served
dense with it).

llama.cpp stores Llama's q and k projections with the rows of each head interleaved for its
rotary layout; whatever their type, they are put back in Hugging Face's order, as
transformers does when it reads the file.
"""
from __future__ import annotations

import logging
import re
from collections import Counter

import numpy as np
import torch

from .int4_linear import Int4Weight
from .int8_linear import Int8Weight
from .projections import LM_HEAD

logger = logging.getLogger(__name__)

_PROJECTIONS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def gguf_projections(path: str) -> dict[str, object]:
    """The file's layer projections and LM head (``gguf.ReaderTensor``s) by Hugging Face
    module name; the LM head (``lm_head``) is the file's ``output`` tensor or, where the file
    has none (tied to the embedding), its ``token_embd``, as llama.cpp reads it."""
    from gguf import GGUFReader

    found, vocabulary = {}, {}
    for tensor in GGUFReader(path).tensors:
        match = _NAME.fullmatch(tensor.name)
        if match is not None and match[2] in _PROJECTIONS:
            found[f"model.layers.{match[1]}.{_PROJECTIONS[match[2]]}"] = tensor
        elif tensor.name in ("output.weight", "token_embd.weight"):
            vocabulary[tensor.name] = tensor
    head = vocabulary.get("output.weight", vocabulary.get("token_embd.weight"))
    if head is not None:
        found[LM_HEAD] = head
    return found


def gguf_weights(path: str, num_heads: int,
                 num_kv_heads: int) -> dict[str, Int4Weight | Int8Weight]:
    """Every projection of the file at ``path`` of a type served quantized, keyed by its
    Hugging Face module name (``model.layers.{i}.self_attn.q_proj``, ..., ``lm_head``)."""
    weights = {}
    for name, tensor in gguf_projections(path).items():
        width, rows = (int(n) for n in tensor.shape[:2])  # GGUF lists the fastest dimension first
        weight = decode(np.asarray(tensor.data), rows, width, tensor.tensor_type.name)
        if weight is None:
            continue
        if name.endswith(("q_proj", "k_proj")):
            heads = num_heads if name.endswith("q_proj") else num_kv_heads
            weight = weight.rows(_unpermute(rows, heads))
        weights[name] = weight
    return weights


def decode(raw: np.ndarray, rows: int, width: int, kind: str) -> Int4Weight | Int8Weight | None:
    """The ``[rows, width]`` weight of type ``kind`` (``"Q4_K"``, ...) stored as ``raw``
    bytes; ``None`` for a type served dense."""
    if kind not in _BLOCKS:
        return None
    weights, size, decoder = _BLOCKS[kind]
    return decoder(raw.reshape(rows, width // weights, size))


def log_served(path: str, used: set[str]) -> str:
    """Log (info) and return how many projections of each type are served quantized/dense."""
    projections = gguf_projections(path)
    served = Counter((t.tensor_type.name, name in used) for name, t in projections.items())
    counts = ", ".join(f"{kind} {served[kind, True]} quantized / {served[kind, False]} dense"
                       for kind in sorted({kind for kind, _ in served}))
    line = f"{path}: GGUF projections by type: {counts}"
    logger.info(line)
    return line


def _f16(pairs: np.ndarray) -> torch.Tensor:
    """Float16 values stored as byte pairs (``[..., 2]`` uint8), as float32."""
    return torch.from_numpy(pairs.copy().view(np.float16)[..., 0].astype(np.float32))


def _fields(packed: np.ndarray, bits: int) -> np.ndarray:
    """``[..., n]`` bytes -> ``[..., 8 / bits, n]`` fields of ``bits`` bits, lowest first
    (``bits=4``: the low nibbles, then the high ones)."""
    mask = (1 << bits) - 1
    return np.stack([packed >> shift & mask for shift in range(0, 8, bits)], axis=-2)


def _blocks_of_32(blocks: np.ndarray, kind: str) -> Int4Weight | Int8Weight:
    """Q4_0 / Q4_1 / Q8_0 blocks ``[rows, width / 32, bytes per block]``."""
    rows = blocks.shape[0]
    d = _f16(blocks[..., 0:2])
    levels = blocks[..., 4 if kind == "Q4_1" else 2:]
    if kind == "Q8_0":
        return Int8Weight(torch.from_numpy(levels.copy().view(np.int8).reshape(rows, -1)), d, 32)
    q = torch.from_numpy(_fields(levels, 4).reshape(rows, -1))
    zeros = _f16(blocks[..., 2:4]) + 8 * d if kind == "Q4_1" else torch.zeros_like(d)
    return Int4Weight(q, d, zeros, 32)


def _q4_k(blocks: np.ndarray) -> Int4Weight:
    """Q4_K super-blocks ``[rows, width / 256, 144]``: ``d``, ``dmin``, 12 bytes of packed
    6-bit ``sc`` / ``mn``, then 128 bytes of nibbles (bytes ``32j..32j+31`` hold sub-block
    ``2j`` in their low nibbles, ``2j + 1`` in their high ones)."""
    from gguf.quants import Q4_K

    rows, supers = blocks.shape[:2]
    sc, mn = (torch.from_numpy(a.reshape(rows, supers, 8).astype(np.float32))
              for a in Q4_K.get_scale_min(blocks[..., 4:16].reshape(-1, 12)))
    scales = _f16(blocks[..., 0:2])[..., None] * sc
    zeros = 8 * scales - _f16(blocks[..., 2:4])[..., None] * mn
    q = _fields(blocks[..., 16:].reshape(rows, supers, 4, 32), 4)
    q = torch.from_numpy(q.reshape(rows, -1))
    return Int4Weight(q, scales.reshape(rows, -1), zeros.reshape(rows, -1), 32)


def _q6_k(blocks: np.ndarray) -> Int8Weight:
    """Q6_K super-blocks ``[rows, width / 256, 210]``: 128 bytes ``ql``, 64 bytes ``qh``, 16
    int8 ``sc``, then ``d``. Each half of 128 weights takes 64 bytes of ``ql`` (weights
    ``0..63`` in their low nibbles, ``64..127`` in their high ones) and 32 bytes of ``qh``
    (weights ``32t..32t+31`` in bits ``2t, 2t+1``)."""
    rows, supers = blocks.shape[:2]
    low = _fields(blocks[..., :128].reshape(rows, supers, 2, 64), 4)
    high = _fields(blocks[..., 128:192].reshape(rows, supers, 2, 32), 2)
    q = (low.reshape(rows, -1) | high.reshape(rows, -1) << 4).astype(np.int8) - 32
    sc = torch.from_numpy(blocks[..., 192:208].view(np.int8).astype(np.float32))
    scales = _f16(blocks[..., 208:210])[..., None] * sc
    return Int8Weight(torch.from_numpy(q), scales.reshape(rows, -1), 16)


def _five_bits(qh: np.ndarray, nibbles: np.ndarray) -> np.ndarray:
    """Q5_0 / Q5_1 levels 0..31 ``[rows, blocks, 32]`` (int8) from each block's ``qh`` (4
    bytes, bit ``j`` weight ``j``'s fifth) and 16 bytes of nibbles (low nibbles weights
    0-15, high ones 16-31)."""
    high = np.unpackbits(qh, axis=-1, bitorder="little")
    return (_fields(nibbles, 4).reshape(high.shape) | high << 4).astype(np.int8)


def _q5_0(blocks: np.ndarray) -> Int8Weight:
    """Q5_0 blocks ``[rows, width / 32, 22]``: ``d``, ``qh``, then the nibbles."""
    rows = blocks.shape[0]
    q = _five_bits(blocks[..., 2:6], blocks[..., 6:22]) - 16
    return Int8Weight(torch.from_numpy(q.reshape(rows, -1)), _f16(blocks[..., 0:2]), 32)


def _q5_1(blocks: np.ndarray) -> Int8Weight:
    """Q5_1 blocks ``[rows, width / 32, 24]``: ``d``, ``m``, ``qh``, then the nibbles."""
    rows = blocks.shape[0]
    q = _five_bits(blocks[..., 4:8], blocks[..., 8:24])
    return Int8Weight(torch.from_numpy(q.reshape(rows, -1)), _f16(blocks[..., 0:2]), 32,
                      zeros=_f16(blocks[..., 2:4]))


def _q5_k(blocks: np.ndarray) -> Int8Weight:
    """Q5_K super-blocks ``[rows, width / 256, 176]``: ``d``, ``dmin``, 12 bytes of packed
    6-bit ``sc`` / ``mn`` (as Q4_K's), 32 bytes ``qh`` (bit ``j`` of byte ``l``: sub-block
    ``j``'s weight ``l``), then 128 bytes of nibbles (as Q4_K's)."""
    from gguf.quants import Q4_K

    rows, supers = blocks.shape[:2]
    sc, mn = (torch.from_numpy(a.reshape(rows, supers, 8).astype(np.float32))
              for a in Q4_K.get_scale_min(blocks[..., 4:16].reshape(-1, 12)))
    scales = _f16(blocks[..., 0:2])[..., None] * sc
    zeros = -(_f16(blocks[..., 2:4])[..., None] * mn)
    low = _fields(blocks[..., 48:].reshape(rows, supers, 4, 32), 4).reshape(rows, supers, 8, 32)
    high = _fields(blocks[..., 16:48], 1)  # [rows, supers, 8 sub-blocks, 32]
    q = (low | high << 4).astype(np.int8)
    return Int8Weight(torch.from_numpy(q.reshape(rows, -1)), scales.reshape(rows, -1), 32,
                      zeros=zeros.reshape(rows, -1))


def _two_bits(packed: np.ndarray) -> np.ndarray:
    """Q2_K / Q3_K's 64 bytes ``[rows, supers, 64]`` of 2-bit fields -> ``[rows, supers, 256]``
    (weight ``128 c + 32 j + l`` in bits ``2j`` of byte ``32 c + l``)."""
    rows, supers = packed.shape[:2]
    return _fields(packed.reshape(rows, supers, 2, 32), 2).reshape(rows, supers, 256)


def _q2_k(blocks: np.ndarray) -> Int4Weight:
    """Q2_K super-blocks ``[rows, width / 256, 84]``: 16 bytes ``sc | mn << 4``, 64 bytes of
    2-bit levels, ``d``, ``dmin``."""
    rows, supers = blocks.shape[:2]
    sc = torch.from_numpy((blocks[..., :16] & 0x0F).astype(np.float32))
    mn = torch.from_numpy((blocks[..., :16] >> 4).astype(np.float32))
    scales = _f16(blocks[..., 80:82])[..., None] * sc
    zeros = 8 * scales - _f16(blocks[..., 82:84])[..., None] * mn
    q = torch.from_numpy(_two_bits(blocks[..., 16:80]).reshape(rows, -1))
    return Int4Weight(q, scales.reshape(rows, -1), zeros.reshape(rows, -1), 16)


def _q3_k(blocks: np.ndarray) -> Int4Weight:
    """Q3_K super-blocks ``[rows, width / 256, 110]``: 32 bytes ``hmask``, 64 bytes of 2-bit
    low levels, 12 bytes of scales (16 low nibbles in bytes 0-7, low first; 16 2-bit high
    parts in bytes 8-11, scale ``4 s + k`` in bits ``2s`` of byte ``8 + k``), ``d``."""
    rows, supers = blocks.shape[:2]
    packed = blocks[..., 96:108]
    low = _fields(packed[..., :8], 4).reshape(rows, supers, 16)
    high = _fields(packed[..., 8:], 2).reshape(rows, supers, 16)
    sc = torch.from_numpy((low | high << 4).astype(np.float32) - 32)
    scales = _f16(blocks[..., 108:110])[..., None] * sc
    no_offset = _fields(blocks[..., :32], 1).reshape(rows, supers, 256)
    q = _two_bits(blocks[..., 32:96]) + 4 * no_offset  # the level + 4: 0..7
    return Int4Weight(torch.from_numpy(q.reshape(rows, -1)), scales.reshape(rows, -1),
                      4 * scales.reshape(rows, -1), 16)


def _table_levels(nibbles: np.ndarray) -> np.ndarray:
    """IQ4 levels: each block's 16 bytes of nibbles (low nibbles weights 0-15, high ones
    16-31) looked up in llama.cpp's int8 table."""
    from gguf.quants import IQ4_NL

    index = _fields(nibbles, 4).reshape(*nibbles.shape[:-1], 32)
    return np.array(IQ4_NL.kvalues, dtype=np.int8)[index]


def _iq4_nl(blocks: np.ndarray) -> Int8Weight:
    """IQ4_NL blocks ``[rows, width / 32, 18]``: ``d``, then 16 bytes of nibbles."""
    rows = blocks.shape[0]
    q = _table_levels(blocks[..., 2:18])
    return Int8Weight(torch.from_numpy(q.reshape(rows, -1)), _f16(blocks[..., 0:2]), 32)


def _iq4_xs(blocks: np.ndarray) -> Int8Weight:
    """IQ4_XS super-blocks ``[rows, width / 256, 136]``: ``d``, a little-endian 16-bit word of
    the scales' high bits (sub-block ``b`` at bits ``2b``), 4 bytes of their low nibbles
    (sub-block ``2i`` low, ``2i + 1`` high in byte ``i``), 8 x 16 bytes of nibbles."""
    rows, supers = blocks.shape[:2]
    low = _fields(blocks[..., 4:8], 4).swapaxes(-1, -2).reshape(rows, supers, 8)
    words = blocks[..., 2].astype(np.uint16) | blocks[..., 3].astype(np.uint16) << 8
    high = np.stack([words >> (2 * b) & 3 for b in range(8)], axis=-1).astype(np.uint8)
    ls = torch.from_numpy((low | high << 4).astype(np.float32) - 32)
    scales = _f16(blocks[..., 0:2])[..., None] * ls
    q = _table_levels(blocks[..., 8:].reshape(rows, supers, 8, 16))
    return Int8Weight(torch.from_numpy(q.reshape(rows, -1)), scales.reshape(rows, -1), 32)


# type -> (weights per block, bytes per block, decoder of [rows, blocks, bytes])
_BLOCKS = {
    "Q4_0": (32, 18, lambda blocks: _blocks_of_32(blocks, "Q4_0")),
    "Q4_1": (32, 20, lambda blocks: _blocks_of_32(blocks, "Q4_1")),
    "Q8_0": (32, 34, lambda blocks: _blocks_of_32(blocks, "Q8_0")),
    "Q5_0": (32, 22, _q5_0), "Q5_1": (32, 24, _q5_1), "IQ4_NL": (32, 18, _iq4_nl),
    "Q2_K": (256, 84, _q2_k), "Q3_K": (256, 110, _q3_k), "Q4_K": (256, 144, _q4_k),
    "Q5_K": (256, 176, _q5_k), "Q6_K": (256, 210, _q6_k), "IQ4_XS": (256, 136, _iq4_xs),
}


def _unpermute(rows: int, heads: int) -> torch.Tensor:
    """The row order that undoes llama.cpp's rotary interleave of a q or k projection."""
    return torch.arange(rows).view(heads, rows // heads // 2, 2).transpose(1, 2).reshape(rows)
