"""``benchmarks/attention_timings.py`` is GPU-only: off a GPU it must refuse clearly, not crash."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "attention_timings.py"


def test_benchmark_refuses_without_gpu_kernels(tmp_path):
    """With interpreted Triton (always the case under these tests) nothing is measured."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, str(BENCH), "--quick"], capture_output=True,
                          text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "needs a CUDA device" in proc.stderr


SUITE = BENCH.with_name("gpu_suite.py")


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the suite would run in full")
def test_gpu_suite_refuses_without_cuda(tmp_path):
    proc = subprocess.run([sys.executable, str(SUITE), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "needs a CUDA GPU" in proc.stderr and not list(tmp_path.iterdir())


@pytest.mark.extended
def test_gpu_suite_mix_modes_are_the_engines():
    """``--mix-modes`` offers exactly the modes ``gpu_engine`` can run, and refuses others."""
    check = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('s', sys.argv[1]); "
             "suite = importlib.util.module_from_spec(spec); spec.loader.exec_module(suite); "
             "from paged_core.bench.gpu_engine import MIX_MODES; "
             "assert set(suite.MIX_MODE_NAMES) == set(MIX_MODES), suite.MIX_MODE_NAMES")
    proc = subprocess.run([sys.executable, "-c", check, str(SUITE)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([sys.executable, str(SUITE), "--mix-modes", "paged-core-fastest"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "--mix-modes" in proc.stderr, proc.stderr


def test_host_waits_counts_each_wait_for_tokens_and_puts_the_method_back():
    from paged_core.bench.gpu_engine import host_waits
    from paged_core.sample.pending_tokens import PendingTokens

    untimed = PendingTokens.tolist
    with host_waits() as waits:
        assert PendingTokens(torch.tensor([3, 1, 4])).tolist() == [3, 1, 4]
        assert PendingTokens(torch.tensor([5])).tolist() == [5]
    assert waits["steps"] == 2 and waits["host_waited_s"] >= 0.0
    assert PendingTokens.tolist is untimed
