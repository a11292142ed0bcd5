"""Tensor parallelism from code without an ``if __name__ == "__main__":`` guard.

vLLM's quickstart is such a script; ``python -c`` and an interactive session
have no guard either. Workers are fresh interpreters that never import the
user's main module, so the same unguarded code (it never calls ``shutdown()``,
like the quickstart) runs once, forms the group, prints greedy tokens equal to
transformers' and exits cleanly with its workers. One case runs under an
interpreter that cannot import ``paged_core`` until the code puts the source
folder on ``sys.path`` itself; the workers must still import it.
"""
import json
import os
import pickle
import signal
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import psutil
import pytest

from paged_core import EngineConfig, LLMEngine

from ..reference import passage_token_ids
from ..tiny_models import build_tiny_model
from .test_tp_parity import reference_tokens

pytestmark = pytest.mark.extended

SOURCE = str(Path(__file__).resolve().parents[2])  # the folder holding paged_core/
MAX_TOKENS = 16
RUN_TIMEOUT_S = 180  # a run takes 20-90 s on 2 busy cores; the old spawn code hung, then failed
MARKER = "unguarded code ran"
PRINT_PURELIB = "import sysconfig; print(sysconfig.get_path('purelib'))"
CODE = textwrap.dedent("""\
    import json, sys
    sys.path.insert(0, {source!r})
    print({marker!r}, flush=True)
    from paged_core import LLM, SamplingParams
    llm = LLM(model={folder!r}, dtype="float32", num_kv_blocks=32, tensor_parallel_size=2)
    params = SamplingParams(temperature=0, max_tokens={max_tokens}, ignore_eos=True)
    outputs = llm.generate({prompts!r}, params, use_tqdm=False)
    print("tokens", json.dumps([o.outputs[0].token_ids for o in outputs]), flush=True)
""")


@pytest.fixture(scope="module")
def case(tokenizer, tmp_path_factory):
    """The unguarded code for a tiny Llama, and transformers' greedy tokens for its prompts."""
    folder = build_tiny_model("llama", str(tmp_path_factory.mktemp("model") / "llama"), tokenizer)
    prompts = [passage_token_ids(tokenizer, n, offset=4 * i) for i, n in enumerate([6, 29])]
    code = CODE.format(source=SOURCE, marker=MARKER, folder=folder, prompts=prompts,
                       max_tokens=MAX_TOKENS)
    return code, reference_tokens(folder, prompts, MAX_TOKENS)


@pytest.fixture(scope="module")
def python_without_paged_core(tmp_path_factory) -> str:
    """A venv whose site-packages names ours in a ``.pth`` file: it imports torch and
    transformers, but not paged_core (the ``.pth`` files of a folder added that way, which
    install our editable package, are not run)."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    purelib = subprocess.run([python, "-c", PRINT_PURELIB], check=True, capture_output=True,
                             text=True).stdout.strip()
    Path(purelib, "packages.pth").write_text(sysconfig.get_path("purelib") + "\n")
    probe = subprocess.run([python, "-c", "import torch, transformers, paged_core"],
                           cwd=venv, env=_env(), capture_output=True, text=True)
    assert "No module named 'paged_core'" in probe.stderr, \
        f"this interpreter should not import paged_core by itself: {probe.stderr[-2000:]}"
    return python


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def run_unguarded(argv: list[str], cwd: Path, stdin: str | None = None) -> tuple[str, str]:
    """Run ``argv`` in its own session; a run that outlives ``RUN_TIMEOUT_S`` fails the test.
    Its workers share its stdout, so this returns only once they have exited too."""
    process = subprocess.Popen(argv, cwd=cwd, env=_env(), text=True, start_new_session=True,
                               stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = process.communicate(stdin, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the engine and its workers
        out, err = process.communicate()
        pytest.fail(f"still running after {RUN_TIMEOUT_S} s; stdout:\n{out}\n"
                    f"stderr:\n{err[-3000:]}")
    assert process.returncode == 0, err[-3000:]
    return out, err


def assert_ran_once_with_parity(out: str, err: str, expected: list[list[int]]) -> None:
    assert out.count(MARKER) == 1, out  # the workers did not run the user's code
    tokens = [line.removeprefix("tokens ") for line in out.splitlines()
              if line.startswith("tokens ")]
    assert len(tokens) == 1, err[-3000:]
    assert json.loads(tokens[0]) == expected
    assert "Traceback" not in err, err[-3000:]  # no worker failed, also not at exit


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_unguarded_script(case, tmp_path):
    code, expected = case
    script = tmp_path / "quickstart.py"
    script.write_text(code)
    assert_ran_once_with_parity(*run_unguarded([sys.executable, str(script)], tmp_path), expected)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_python_c_with_the_source_folder_on_sys_path(case, python_without_paged_core, tmp_path):
    code, expected = case
    out, err = run_unguarded([python_without_paged_core, "-c", code], tmp_path)
    assert_ran_once_with_parity(out, err, expected)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_interactive_session_fed_through_stdin(case, tmp_path):
    """``python -i`` runs the code statement by statement as a REPL reading a pipe (the
    workers read their arguments from pipes of their own, never the session's stdin)."""
    code, expected = case
    out, err = run_unguarded([sys.executable, "-i"], tmp_path, stdin=code)
    assert_ran_once_with_parity(out, err, expected)


def test_a_config_defined_in_main_is_refused_before_any_worker_starts(tokenizer, tmp_path,
                                                                     monkeypatch):
    """A worker could not unpickle it (and the driver would wait for the group until timeout)."""
    MainConfig = type("MainConfig", (EngineConfig,), {"__module__": "__main__"})
    monkeypatch.setattr(sys.modules["__main__"], "MainConfig", MainConfig, raising=False)
    folder = build_tiny_model("llama", str(tmp_path / "llama"), tokenizer)
    children = psutil.Process().children(recursive=True)
    with pytest.raises(pickle.PicklingError, match=r"__main__\.MainConfig is sent to the"):
        LLMEngine(MainConfig(model=folder, dtype="float32", num_kv_blocks=8,
                             tensor_parallel_size=2))
    assert psutil.Process().children(recursive=True) == children
