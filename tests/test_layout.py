"""The import rule, read from the code: front ends -> app -> drafting/core/llama; drafting, llama -> core; no circles.

Every ``import`` and ``from … import`` of a localspec module (top level
or inside a function) is an arrow. The layers may only point where the rule
allows, only ``localspec/llama/`` may import llama_cpp, and the module graph
has no cycles. The exact core never imports the speed policy (``drafting``): it
asks it only through the protocols of ``core/policy.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .conftest import ROOT

ALLOWED = {  # layer -> layers it may import
    "core": {"core"},
    "llama": {"llama", "core"},
    "drafting": {"drafting", "core"},
    "app": {"app", "core", "llama", "drafting"},
    "cli": {"cli", "app", "core"},
    "bench": {"bench", "app", "core"},
    "serve": {"serve", "app", "core"},
    "ui": {"ui", "app", "core"},
    "library": {"library", "app", "core"},
}


def layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "localspec" and len(parts) > 1 and parts[1] in ALLOWED:
        return parts[1]
    return None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports (relative imports resolved)."""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return found


def graph() -> dict[str, set[str]]:
    files = [p for p in (ROOT / "localspec").rglob("*.py")]
    modules = {module_name(p): p for p in files}
    return {name: {m for m in imports_of(path) if m in modules and m != name} for name, path in modules.items()}


def violations(edges: dict[str, set[str]]) -> list[str]:
    found = []
    for source, targets in edges.items():
        for target in targets:
            a, b = layer(source), layer(target)
            if a is not None and b is not None and b not in ALLOWED[a]:
                found.append(f"{source} -> {target} ({a} may not import {b})")
    return found


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Cycles of the module graph (package ``__init__`` faces excluded: importing a submodule runs them)."""
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt in {s for s in stack[:-1]} or state.get(nxt) == "open":
                found.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node)
    return found


def test_every_arrow_follows_the_layers() -> None:
    edges = graph()
    assert len(edges) > 30 and any(edges.values())  # the graph was really read
    assert violations(edges) == []


def test_no_import_circles() -> None:
    assert cycles(graph()) == []


def test_only_the_llama_layer_imports_llama_cpp() -> None:
    for path in [p for p in (ROOT / "localspec").rglob("*.py")]:
        if any(m == "llama_cpp" or m.startswith("llama_cpp.") for m in imports_of(path)):
            assert layer(module_name(path)) == "llama", path


def test_core_never_imports_the_drafting_policy() -> None:
    """The exact core stays small: the loop receives its policy and drafters, it never imports them."""
    edges = graph()
    assert any(layer(m) == "drafting" for m in edges)  # the package is there to be imported
    assert [f"{source} -> {target}" for source, targets in edges.items() if layer(source) == "core"
            for target in targets if layer(target) == "drafting"] == []  # fmt: skip


def test_the_checks_catch_what_they_look_for() -> None:
    """Negative controls: an upward arrow, core importing the drafting policy, a front end importing
    another, and a circle are all reported."""
    bad = {
        "localspec.core.loop": {"localspec.app.engine", "localspec.drafting.adaptive"},
        "localspec.ui.app": {"localspec.cli.main"},
        "localspec.app.engine": {"localspec.app.invariance"},
        "localspec.app.invariance": {"localspec.app.engine"},
    }
    assert len(violations(bad)) == 3
    assert cycles(bad) and set(cycles(bad)[0]) == {"localspec.app.engine", "localspec.app.invariance"}


@pytest.mark.models
def test_the_python_api_example_runs(demo_paths) -> None:
    """The package docstring's example is real: it runs on the demo pair and its outputs are checked."""
    import doctest

    import localspec

    failures, tried = doctest.testmod(localspec, verbose=False, raise_on_error=False)
    assert tried == 4 and failures == 0
