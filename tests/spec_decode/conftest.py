"""Narrow-vocabulary tiny target and draft models, built once for the package's tests."""
import pytest

from .narrow_models import build_narrow_model


@pytest.fixture(scope="session")
def target(tmp_path_factory, tokenizer):
    return build_narrow_model(str(tmp_path_factory.mktemp("target")), tokenizer)


@pytest.fixture(scope="session")
def draft(tmp_path_factory, tokenizer):
    return build_narrow_model(str(tmp_path_factory.mktemp("draft")), tokenizer, noise=1.5)
