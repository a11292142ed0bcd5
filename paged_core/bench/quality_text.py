"""The fixed English text ``bench quality`` scores (``quality_text.txt``, shipped in the package).

The tests' prompts are cut from the same text (``tests/reference.py``), so a change to the
file changes both. Invariant: one paragraph, no leading or trailing whitespace once read.
"""
from __future__ import annotations

from importlib import resources


def quality_text() -> str:
    return resources.files(__package__).joinpath("quality_text.txt").read_text("utf-8").strip()
