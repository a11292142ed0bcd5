"""``gpu_engine.offline_mix`` reports each system's failure without losing the others': on an
offline GPU machine the baselines' model load failed (transformers 5.25 fetching hub kernels)
and took paged-core's timings of the same section with it. The GPU work itself is replaced
here by recorders (the section's bookkeeping is what is under test; the GPU tier times the
real thing)."""
import pytest

from paged_core.bench import gpu_engine


@pytest.fixture
def mix_without_gpu(monkeypatch):
    timed = []

    def paged_core_mix(folder, requests, settings):
        timed.append(settings)
        return {"seconds": 2.0, "output_tokens": 4 * len(requests)}

    monkeypatch.setattr(gpu_engine, "_paged_core_mix", paged_core_mix)
    monkeypatch.setattr(gpu_engine, "_release", lambda: None)
    return timed


def test_a_baseline_model_that_fails_to_load_keeps_paged_cores_results(
        mix_without_gpu, monkeypatch, tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    def refuse(*args, **kwargs):
        assert kwargs.get("use_kernels") is False  # never the hub's kernels: no internet there
        raise ValueError("Version 2 of 'kernels-community/rotary' is not available")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)
    results = gpu_engine.offline_mix(str(tmp_path), tokenizer, num_requests=8,
                                     modes=("paged-core", "paged-core-async"),
                                     baselines=("transformers-static",))
    assert mix_without_gpu == [{}, {"schedule_ahead": False}]
    assert results["paged-core"]["output_tok_per_s"] == 16.0
    assert results["paged-core-async"]["output_tok_per_s"] == 16.0
    assert results["transformers-static"] == {
        "error": "loading the model: ValueError: Version 2 of 'kernels-community/rotary' is "
                 "not available"}


def test_without_the_default_mode_the_speedups_are_left_out(mix_without_gpu, tokenizer,
                                                            tmp_path):
    results = gpu_engine.offline_mix(str(tmp_path), tokenizer, num_requests=8,
                                     modes=("paged-core-async",), baselines=())
    assert set(results) == {"workload", "paged-core-async"}
    assert results["workload"]["num_requests"] == 8
