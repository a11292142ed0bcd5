"""``VllmCpu``: the long-lived vLLM worker that ``bench throughput`` interleaves with paged-core.

vLLM itself is not installed in the test environment, so these tests put a
minimal ``vllm`` package (``LLM.generate`` returning outputs of the requested
lengths) first on the worker's ``PYTHONPATH``: the worker script, the line
protocol and the error path are the real ones.
"""
import textwrap

import pytest

from paged_core.bench.vllm_runner import VllmCpu
from paged_core.bench.workload import BenchRequest

FAKE_VLLM = '''
__version__ = "0.0-test"
calls = []

class SamplingParams:
    def __init__(self, max_tokens, ignore_eos=False, temperature=1.0):
        self.max_tokens = max_tokens

class _Completion:
    def __init__(self, n):
        self.token_ids = list(range(n))

class _Output:
    def __init__(self, n):
        self.outputs = [_Completion(n)]

class LLM:
    def __init__(self, model, dtype, gpu_memory_utilization, seed, max_model_len):
        assert max_model_len >= 16
        self.resets = 0

    def reset_prefix_cache(self):
        self.resets += 1

    def generate(self, prompts, params, use_tqdm=False):
        assert len(prompts) == len(params)
        assert all("prompt_token_ids" in p for p in prompts)
        return [_Output(p.max_tokens) for p in params]
'''


@pytest.fixture
def fake_vllm_path(tmp_path, monkeypatch):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text(textwrap.dedent(FAKE_VLLM))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return tmp_path


def test_worker_serves_several_runs_in_one_process(fake_vllm_path):
    import sys

    system = VllmCpu(sys.executable, "float32", threads=1, max_model_len=64)
    try:
        system.warmup()
        requests = [BenchRequest([1, 2, 3], 5), BenchRequest([4, 5], 7)]
        first, second = system.run(requests), system.run(requests[:1])
        pid = system._proc.pid
    finally:
        system.close()
    assert (first.system, first.output_tokens, first.prompt_tokens) == ("vllm-cpu", 12, 5)
    assert second.output_tokens == 5 and first.seconds >= 0 and second.seconds >= 0
    assert first.extra["vllm_version"] == "0.0-test"
    assert system._proc.returncode == 0 and pid > 0  # exited when its stdin closed


def test_worker_failure_raises_with_its_stderr(fake_vllm_path):
    import sys

    (fake_vllm_path / "vllm" / "__init__.py").write_text("raise ImportError('no CPU build here')\n")
    with pytest.raises(RuntimeError, match="no CPU build here"):
        VllmCpu(sys.executable, "float32", threads=1, max_model_len=64)


def test_another_paged_core_tree_runs_in_its_own_process_from_its_own_source(tmp_path):
    """``PagedCoreTree`` imports the tree it is given, not this one: a stand-in tree whose
    ``paged_core`` is a minimal vLLM-style ``LLM`` answers through the real worker."""
    from paged_core.bench.paged_core_tree import PagedCoreTree

    (tmp_path / "paged_core").mkdir()
    (tmp_path / "paged_core" / "__init__.py").write_text(
        textwrap.dedent(FAKE_VLLM).replace("0.0-test", "tree-under-test").replace(
            "gpu_memory_utilization, seed, max_model_len", "kv_cache_memory").replace(
            "assert max_model_len >= 16", "assert kv_cache_memory == 1 << 20"))
    system = PagedCoreTree(str(tmp_path), "float32", threads=1, kv_cache_memory=1 << 20)
    try:
        result = system.run([BenchRequest([1, 2], 4)])
    finally:
        system.close()
    assert system.name == f"paged-core@{tmp_path.name}"  # not a git checkout: its folder name
    assert result.output_tokens == 4 and result.extra["paged_core_version"] == "tree-under-test"


def test_another_paged_core_tree_takes_the_runs_engine_settings(tmp_path):
    """``--max-num-seqs 8`` reaches the other tree's ``LLM`` too: its engine runs the same
    batches as this one's, or a before/after comparison compares two batch sizes."""
    from paged_core.bench.paged_core_tree import PagedCoreTree

    (tmp_path / "paged_core").mkdir()
    (tmp_path / "paged_core" / "__init__.py").write_text(
        textwrap.dedent(FAKE_VLLM).replace(
            "gpu_memory_utilization, seed, max_model_len", "kv_cache_memory, max_num_seqs").replace(
            "assert max_model_len >= 16", "assert max_num_seqs == 8"))
    system = PagedCoreTree(str(tmp_path), "float32", threads=1, kv_cache_memory=1 << 20,
                           engine_args={"max_num_seqs": 8})
    try:
        result = system.run([BenchRequest([1, 2], 3)])
    finally:
        system.close()
    assert result.output_tokens == 3


def test_a_folder_without_paged_core_is_refused(tmp_path):
    from paged_core.bench.paged_core_tree import PagedCoreTree

    with pytest.raises(SystemExit, match="no paged_core package"):
        PagedCoreTree(str(tmp_path), "float32", threads=1, kv_cache_memory=1 << 20)
