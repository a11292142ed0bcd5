"""Shared fixtures: the embedded model, a Hugging Face reference, tiny random models.

Environment set before anything imports torch or triton: Triton runs in its
interpreter on CPU, and OpenMP threads sleep when idle (this machine is shared): with
two test workers and their servers sharing 2 cores, the engine's bounded spin between
ops (``cpu/openmp_spin.py``, ``GOMP_SPINCOUNT``) burns the time slices the others need
(measured: a 4-file parity subset took 611 s with it, 140 s without), so tests and every
process they start do without it unless told otherwise. Likewise the copy of a loaded
model's weights onto 2 MiB pages (``cpu/huge_pages.py``; 0.4-1.3 s for a fresh process's
first load of the embedded model): ``tests/cpu/test_huge_pages.py`` turns it on and checks
that it changes no token, and the parity tests (``tests/parity/conftest.py``) run with it on.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("GOMP_SPINCOUNT", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PAGED_CORE_WEIGHTS_ON_HUGE_PAGES", "false")

import pytest  # noqa: E402

# Files that start servers, ranks or fresh venvs go out to the test workers first (``--dist
# loadfile`` hands files out in collection order): one of them started last, alone on its
# worker, would set the suite's wall time.
_HEAVY_FIRST = ("tests/e2e/", "tests/tensor_parallel/", "tests/bench/", "tests/quantization/",
                "tests/parity/")


def _heaviness(item) -> int:
    return next((rank for rank, folder in enumerate(_HEAVY_FIRST)
                 if item.nodeid.startswith(folder)), len(_HEAVY_FIRST))


def pytest_collection_modifyitems(config, items):
    items.sort(key=_heaviness)  # stable: a file's tests keep their order


def pytest_configure(config):
    """Each test worker's torch computes on its share of the cores (2 workers on 2 cores: one
    thread each), as ``threads_per_rank`` gives tensor-parallel ranks theirs: two workers of
    two threads each left every parallel region of an engine step waiting on a thread that
    the other worker's held off the core. Tests that need more threads set them
    (``torch_threads``); processes the tests start choose their own."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


@pytest.fixture(scope="session")
def embedded_folder():
    from paged_core.models.embedded_model import embedded_model_folder
    return embedded_model_folder()


@pytest.fixture(scope="session")
def hf_embedded(embedded_folder):
    """The embedded model loaded by transformers in float32: the correctness oracle."""
    import torch
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(embedded_folder, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tokenizer(embedded_folder):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(embedded_folder)


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory, tokenizer):
    """Tiny random-weight checkpoints, each built once a test process (``TinyCheckpoints``):
    read them, copy one to change it."""
    from .tiny_models import TinyCheckpoints
    return TinyCheckpoints(str(tmp_path_factory.mktemp("tiny-checkpoints")), tokenizer)


@pytest.fixture(scope="session")
def llm_fp32():
    """One shared fp32 engine on the embedded model (tests must leave it idle)."""
    from paged_core import LLM
    return LLM(dtype="float32", kv_cache_memory="256MiB")


def _cpu_isa_params():
    from paged_core.cpu.isa import CPU_ISA_LEVELS
    return CPU_ISA_LEVELS


@pytest.fixture(params=_cpu_isa_params())
def cpu_isa(request, monkeypatch):
    """Each CPU path (``paged_core.cpu.isa`` level) in turn, selected through the user's
    setting ``PAGED_CORE_CPU_ISA`` for the test's duration; a level this CPU cannot run
    skips, saying which flags it lacks, and one whose kernels do not build skips with why."""
    return _use_cpu_isa(request.param, monkeypatch)


@pytest.fixture(params=[*_cpu_isa_params(), "avx512_bf16+amx"])
def attention_path(request, monkeypatch):
    """``cpu_isa``'s levels, the ``avx512_bf16`` one with its bfloat16 attention tiles on
    ``vdpbf16ps`` (``PAGED_CORE_CPU_ATTENTION=bf16_dot``), then ``avx512_bf16+amx``: the same
    level with them on AMX tiles (``amx``; skips, saying why, on CPUs without AMX-BF16 or
    whose OS grants no tile state). Returns the level."""
    from paged_core.attention.cpu_kernels import bf16_attention_amx

    level, _, tiles = request.param.partition("+")
    level = _use_cpu_isa(level, monkeypatch)
    monkeypatch.setenv("PAGED_CORE_CPU_ATTENTION", tiles or "bf16_dot")
    if tiles:
        try:
            assert bf16_attention_amx(level)
        except (ValueError, RuntimeError) as error:
            pytest.skip(str(error))
    return level


def _use_cpu_isa(level, monkeypatch):
    from paged_core.cpu.extension import cpu_extension_available, cpu_extension_error
    from paged_core.cpu.isa import unsupported_reason

    reason = unsupported_reason(level)
    if reason is not None:
        pytest.skip(reason)
    if not cpu_extension_available(level):
        pytest.skip(f"the {level} C++ kernels do not build here: {cpu_extension_error(level)}")
    monkeypatch.setenv("PAGED_CORE_CPU_ISA", level)
    return level


@pytest.fixture
def torch_threads():
    """``torch_threads(n)`` sets torch's intra-op thread count for the rest of the test; the
    count from before the test comes back after it, however it ends."""
    import torch

    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.fixture
def amx_cpu_without_tile_state(monkeypatch):
    """A CPU that reports AMX-BF16 while the OS grants no AMX tile state (Linux before 5.16):
    the ``avx512_bf16`` kernels' ``bf16_amx_ready`` says no."""
    from paged_core.cpu import extension, isa

    class NoTileState:
        @staticmethod
        def bf16_amx_ready() -> bool:
            return False

    monkeypatch.setattr(isa, "has_amx_bf16", lambda: True)
    monkeypatch.setattr(extension, "cpu_ops", lambda level: NoTileState)
