"""Writing GGUF blocks and files for the tests.

``quantize`` is ``gguf.quants.quantize`` where the ``gguf`` package implements it (Q4_0, Q4_1,
Q8_0, Q5_0, Q5_1); it does not for the K-quants, so Q2_K, Q3_K, Q4_K, Q5_K and Q6_K blocks
are written here by a plain min/max (Q3_K, Q6_K: absolute maximum) rounding (llama.cpp
searches its scales harder, the layout is the same): ``dequantize`` by ``gguf.quants`` reads
them back close to the input, which ``test_k_quant_writers_are_close_to_their_input`` checks.

``requantized_copy`` writes a copy of a GGUF file with some layer tensors re-quantized to
other types (metadata and the other tensors unchanged), as ``gguf_new_metadata`` copies one.
"""
from __future__ import annotations

import numpy as np


def quantize(data: np.ndarray, kind: str) -> np.ndarray:
    """``[rows, width]`` float32 -> ``[rows, bytes]`` uint8 blocks of type ``kind``."""
    from gguf import GGMLQuantizationType, quants

    if kind in ("Q4_K", "Q5_K"):
        return _min_max_k(data, bits=4 if kind == "Q4_K" else 5)
    if kind == "Q6_K":
        return _q6_k(data)
    if kind == "Q2_K":
        return _q2_k(data)
    if kind == "Q3_K":
        return _q3_k(data)
    return quants.quantize(data, GGMLQuantizationType[kind])


def _min_max_k(data: np.ndarray, bits: int) -> np.ndarray:
    """Q4_K (``bits`` 4) or Q5_K (5: the fifth bits in ``qh`` before the nibbles) blocks."""
    rows, top = data.shape[0], (1 << bits) - 1
    x = data.astype(np.float32).reshape(rows, -1, 8, 32)  # super-blocks of 8 sub-blocks
    low = np.minimum(x.min(-1), 0)
    scale, mn = (x.max(-1) - low) / top, -low
    d = (scale.max(-1, keepdims=True) / 63).astype(np.float16)
    dmin = (mn.max(-1, keepdims=True) / 63).astype(np.float16)
    sc = np.clip(np.round(_div(scale, d.astype(np.float32))), 0, 63).astype(np.uint8)
    m = np.clip(np.round(_div(mn, dmin.astype(np.float32))), 0, 63).astype(np.uint8)
    step = d.astype(np.float32) * sc
    offset = dmin.astype(np.float32) * m
    q = np.clip(np.round(_div(x + offset[..., None], step[..., None])), 0, top).astype(np.uint8)
    packed_scales = np.concatenate([
        sc[..., :4] | (sc[..., 4:] >> 4) << 6, m[..., :4] | (m[..., 4:] >> 4) << 6,
        (sc[..., 4:] & 0x0F) | (m[..., 4:] & 0x0F) << 4], axis=-1)
    qs = _pack(q.reshape(*q.shape[:2], 4, 2, 32) & 0x0F, 4).reshape(*q.shape[:2], 128)
    qh = [_pack(q >> 4, 1)] if bits == 5 else []  # bit j of byte l: sub-block j's weight l
    blocks = np.concatenate([d.view(np.uint8), dmin.view(np.uint8), packed_scales, *qh, qs],
                            axis=-1)
    return blocks.reshape(rows, -1)


def _q6_k(data: np.ndarray) -> np.ndarray:
    rows = data.shape[0]
    x = data.astype(np.float32).reshape(rows, -1, 16, 16)  # super-blocks of 16 sub-blocks
    scale = np.abs(x).max(-1) / 31
    d = (scale.max(-1, keepdims=True) / 127).astype(np.float16)
    sc = np.clip(np.round(_div(scale, d.astype(np.float32))), -128, 127).astype(np.int8)
    step = d.astype(np.float32) * sc
    q = (np.clip(np.round(_div(x, step[..., None])), -32, 31) + 32).astype(np.uint8)
    halves = q.reshape(rows, -1, 2, 128)  # each: ql 64 bytes (2 nibbles), qh 32 (4 crumbs)
    ql = _pack(halves.reshape(rows, -1, 2, 2, 64) & 0x0F, 4)
    qh = _pack(halves.reshape(rows, -1, 2, 4, 32) >> 4, 2)
    supers = x.shape[1]
    blocks = np.concatenate([ql.reshape(rows, supers, 128), qh.reshape(rows, supers, 64),
                             sc.view(np.uint8), d.view(np.uint8)], axis=-1)
    return blocks.reshape(rows, -1)


def _q2_k(data: np.ndarray) -> np.ndarray:
    rows = data.shape[0]
    x = data.astype(np.float32).reshape(rows, -1, 16, 16)  # super-blocks of 16 sub-blocks
    low = np.minimum(x.min(-1), 0)
    scale, mn = (x.max(-1) - low) / 3, -low
    d = (scale.max(-1, keepdims=True) / 15).astype(np.float16)
    dmin = (mn.max(-1, keepdims=True) / 15).astype(np.float16)
    sc = np.clip(np.round(_div(scale, d.astype(np.float32))), 0, 15).astype(np.uint8)
    m = np.clip(np.round(_div(mn, dmin.astype(np.float32))), 0, 15).astype(np.uint8)
    step, offset = d.astype(np.float32) * sc, dmin.astype(np.float32) * m
    q = np.clip(np.round(_div(x + offset[..., None], step[..., None])), 0, 3).astype(np.uint8)
    supers = x.shape[1]
    blocks = np.concatenate([sc | m << 4, _two_bit_fields(q, rows, supers), d.view(np.uint8),
                             dmin.view(np.uint8)], axis=-1)
    return blocks.reshape(rows, -1)


def _q3_k(data: np.ndarray) -> np.ndarray:
    rows = data.shape[0]
    x = data.astype(np.float32).reshape(rows, -1, 16, 16)
    scale = np.abs(x).max(-1) / 4
    d = (scale.max(-1, keepdims=True) / 31).astype(np.float16)
    sc = np.clip(np.round(_div(scale, d.astype(np.float32))), -32, 31).astype(np.int8)
    step = d.astype(np.float32) * sc
    q = np.clip(np.round(_div(x, step[..., None])), -4, 3).astype(np.int8)  # low - 4 (1 - high)
    high = (q >= 0).astype(np.uint8)
    low = (q + 4 * (1 - high.astype(np.int8))).astype(np.uint8)
    supers = x.shape[1]
    hmask = _pack(high.reshape(rows, supers, 8, 32), 1)  # bit b of byte l: weight 32 b + l
    sc6 = (sc + 32).astype(np.uint8)
    packed_scales = np.concatenate([
        (sc6[..., :8] & 0x0F) | (sc6[..., 8:] & 0x0F) << 4,
        _pack((sc6 >> 4).reshape(rows, supers, 4, 4), 2)], axis=-1)
    blocks = np.concatenate([hmask, _two_bit_fields(low, rows, supers), packed_scales,
                             d.view(np.uint8)], axis=-1)
    return blocks.reshape(rows, -1)


def _two_bit_fields(q: np.ndarray, rows: int, supers: int) -> np.ndarray:
    """Q2_K / Q3_K's 64 bytes per super-block: weight ``128 c + 32 j + l`` in bits ``2j`` of
    byte ``32 c + l``."""
    return _pack(q.reshape(rows, supers, 2, 4, 32), 2).reshape(rows, supers, 64)


def _pack(fields: np.ndarray, bits: int) -> np.ndarray:
    """``[..., 8 / bits, n]`` fields of ``bits`` bits -> ``[..., n]`` bytes, the first field
    in the lowest bits."""
    packed = np.zeros(fields.shape[:-2] + fields.shape[-1:], np.uint8)
    for i in range(fields.shape[-2]):
        packed |= fields[..., i, :] << (bits * i)
    return packed


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros(np.broadcast_shapes(a.shape, b.shape), np.float32),
                     where=b != 0)


def requantized_copy(source: str, target: str, kinds: dict[str, str]) -> None:
    """Copy the GGUF file ``source`` to ``target`` with each tensor named in ``kinds``
    (``"blk.0.attn_q.weight": "Q8_0"``) dequantized and re-quantized to that type."""
    import gguf
    from gguf import GGMLQuantizationType, quants

    reader = gguf.GGUFReader(source)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(target, arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub_type)
    for tensor in reader.tensors:
        data, kind = np.asarray(tensor.data), tensor.tensor_type
        if tensor.name in kinds:
            dense = quants.dequantize(data, kind).reshape(int(tensor.shape[1]), -1)
            kind = GGMLQuantizationType[kinds[tensor.name]]
            data = quantize(dense, kind.name)
        writer.add_tensor(tensor.name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
