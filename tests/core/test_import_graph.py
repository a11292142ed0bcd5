"""The package's import graph: no circle anywhere, and a pure core.

Every ``import`` in every module counts, at any depth (inside functions, under
``TYPE_CHECKING``): a lazy import hides a circle from Python, not from a reader.
A name taken from a package's ``__init__`` counts as an import of the submodule
that ``__init__`` took it from, so re-exports do not draw false circles.
"""
from __future__ import annotations

import ast
from pathlib import Path

import paged_core

ROOT = Path(paged_core.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in ROOT.rglob("*.py")}


def _imports(name: str) -> list[tuple[str, str | None]]:
    """``(module, imported name or None)`` for every import in module ``name``."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else [])) if node.level \
                else node.module
            found += [(target, alias.name) for alias in node.names]
    return found


def _resolve(module: str, attr: str | None) -> str | None:
    """The project module an import reaches (``None``: outside the project)."""
    if attr and f"{module}.{attr}" in MODULES:
        return f"{module}.{attr}"
    if module not in MODULES:
        return None
    if attr and MODULES[module].name == "__init__.py":
        for source, name in _imports(module):
            if name == attr:
                return _resolve(source, None) or module
    return module


GRAPH = {name: {m for src, attr in _imports(name) if (m := _resolve(src, attr)) and m != name}
         for name in MODULES}


def _circles() -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while not component or w != v:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
            if len(component) > 1:
                found.append(component)

    for v in GRAPH:
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    assert _circles() == []


def test_core_imports_only_itself():
    """``paged_core.core`` is pure: no torch, no tokenizer, nothing else of the package."""
    for name in (n for n in MODULES if n.startswith("paged_core.core")):
        for source, _ in _imports(name):
            assert source.split(".")[0] not in ("torch", "transformers", "tokenizers"), name
            assert not source.startswith("paged_core.") or source.startswith("paged_core.core"), \
                f"{name} imports {source}"
