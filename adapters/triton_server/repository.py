"""``write_repository``: a ready Triton model repository for one ``EngineConfig``.

Layout written (``model_name`` defaults to ``paged_llm``)::

    out_dir/<model_name>/config.pbtxt   # the shipped template, renamed, with parameters
    out_dir/<model_name>/1/model.py     # imports paged_core's TritonPythonModel

Invariant: the written ``parameters`` are exactly ``config``'s set fields, so the
model's ``EngineConfig.from_strings(parameters)`` rebuilds ``config`` (model
paths made absolute, since Triton runs elsewhere).
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from paged_core.config import EngineConfig

from .._settings import config_strings

TEMPLATE_DIR = Path(__file__).resolve().parent / "model_repository" / "paged_llm"
DEFAULT_MODEL_NAME = "paged_llm"


def render_config(config: EngineConfig, model_name: str = DEFAULT_MODEL_NAME,
                  instance_count: int = 1) -> str:
    """The template ``config.pbtxt`` with ``model_name`` and ``config`` as parameters."""
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", model_name):
        raise ValueError(f"model_name must be letters, digits, '_', '.' or '-', got {model_name!r}")
    if instance_count < 1:
        raise ValueError(f"instance_count must be >= 1, got {instance_count}")
    text = (TEMPLATE_DIR / "config.pbtxt").read_text()
    text = re.sub(r'^name: ".*"$', f'name: "{model_name}"', text, count=1, flags=re.M)
    text = re.sub(r"count: \d+ kind:", f"count: {instance_count} kind:", text, count=1)
    lines = [ln for ln in text.splitlines() if not ln.startswith("parameters {")]
    for key, value in sorted(config_strings(config).items()):
        lines.append(f'parameters {{ key: "{key}" value: {{ string_value: {json.dumps(value)} }} }}')
    return "\n".join(lines) + "\n"


def write_repository(out_dir: str | os.PathLike, config: EngineConfig,
                     model_name: str = DEFAULT_MODEL_NAME, instance_count: int = 1) -> Path:
    """Write (or overwrite) ``out_dir/<model_name>``; returns ``out_dir`` as a ``Path``.

    ``instance_count`` > 1 loads one engine per instance (Triton spreads requests
    over them); one instance already batches every request continuously.
    """
    out = Path(out_dir)
    model_dir = out / model_name
    if model_dir.exists():
        shutil.rmtree(model_dir)
    (model_dir / "1").mkdir(parents=True)
    shutil.copyfile(TEMPLATE_DIR / "1" / "model.py", model_dir / "1" / "model.py")
    (model_dir / "config.pbtxt").write_text(render_config(config, model_name, instance_count))
    return out
