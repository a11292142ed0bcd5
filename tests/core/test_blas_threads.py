"""numpy's OpenBLAS runs the step-cost refit on the caller's thread alone (its worker would
busy-wait beside the engine's OpenMP team), and gets its thread count back afterwards."""
import numpy as np
import pytest

from paged_core.core import blas_threads, step_cost
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


class _Call:
    """A ctypes-function stand-in: settable restype / argtypes, returns ``value``."""

    def __init__(self, value=None):
        self.value = value

    def __call__(self, *args):
        return self.value


class _OpenBlas:
    def __init__(self, parallel: int):
        self.openblas_get_parallel64_ = _Call(parallel)
        self.openblas_get_num_threads64_ = _Call(2)
        self.openblas_set_num_threads64_ = _Call()


@pytest.mark.parametrize("parallel, held", [(1, True), (2, False)])
def test_an_openblas_on_openmp_threads_is_left_to_the_engines_team(monkeypatch, tmp_path,
                                                                    parallel, held):
    """OpenBLAS built on OpenMP counts threads with the caller's OpenMP setting, which the
    engine's team owns: nothing is held there; its own pthreads build is held."""
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /opt/lib/libopenblas.so.0\n")
    monkeypatch.setattr(blas_threads, "MAPS", str(maps))
    monkeypatch.setattr(blas_threads.ctypes, "CDLL", lambda path, mode: _OpenBlas(parallel))
    blas_threads._openblas_calls.cache_clear()
    try:
        assert (blas_threads._openblas_calls() is not None) is held
    finally:
        blas_threads._openblas_calls.cache_clear()
