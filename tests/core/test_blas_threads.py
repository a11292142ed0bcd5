"""numpy's OpenBLAS runs the step-cost refit on the caller's thread alone (its worker would
busy-wait beside the engine's OpenMP team), and gets its thread count back afterwards."""
import numpy as np
import pytest

from paged_core.core import step_cost
from paged_core.core.blas_threads import openblas_threads, single_threaded_blas


def _needs_openblas() -> int:
    threads = openblas_threads()
    if threads is None:
        pytest.skip("numpy's BLAS here is not an OpenBLAS this process loaded: nothing to hold")
    return threads


def test_the_body_runs_on_one_thread_and_the_count_comes_back():
    before = _needs_openblas()
    with single_threaded_blas():
        assert openblas_threads() == 1
        np.linalg.lstsq(np.random.default_rng(0).random((256, 3)), np.ones(256), rcond=None)
    assert openblas_threads() == before
    with pytest.raises(RuntimeError, match="refit failed"):
        with single_threaded_blas():
            raise RuntimeError("refit failed")
    assert openblas_threads() == before


def test_the_step_cost_refit_runs_with_one_blas_thread(monkeypatch):
    if _needs_openblas() < 2:
        pytest.skip("OpenBLAS runs on one thread here already")
    seen = []
    fit = step_cost._undisturbed_fit
    monkeypatch.setattr(step_cost, "_undisturbed_fit",
                        lambda steps: seen.append(openblas_threads()) or fit(steps))
    model = step_cost.StepCostModel()
    for tokens in (1, 64, 256, 512):
        model.observe(1, tokens, 0.01 + 0.0002 * tokens)
    assert seen == [1, 1, 1, 1] and model.per_row_s == pytest.approx(0.0002)
