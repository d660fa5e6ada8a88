"""Every third-party module that ``mlxd`` imports comes from a runtime dependency (or a non-test
extra): a plain ``pip install mlxd`` must run every command. ``httpx`` was once a test-only
dependency that `mlxd bench run` imported."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imported_modules() -> dict[str, str]:
    """Top-level module name -> one file of ``mlxd`` that imports it."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "mlxd").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return found


def _declared(extras: bool) -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    if extras:
        specs += [s for k, v in project["optional-dependencies"].items() if k != "test" for s in v]
    return {_normalize(re.split(r"[<>=!~;\[ ]", s, maxsplit=1)[0]) for s in specs}


def _installed_with(names: set[str]) -> set[str]:
    """``names`` and what they require, transitively (markers aside: an over-estimate is fine,
    the test is about a test-only package being imported)."""
    todo, seen = list(names), set(names)
    while todo:
        try:
            reqs = requires(todo.pop()) or []
        except PackageNotFoundError:
            continue
        for req in reqs:
            if "extra ==" in req:
                continue
            name = _normalize(re.split(r"[<>=!~;\[ (]", req, maxsplit=1)[0])
            if name not in seen:
                seen.add(name)
                todo.append(name)
    return seen


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_third_party_import_is_a_runtime_dependency() -> None:
    dists = packages_distributions()
    declared = _installed_with(_declared(extras=True))
    missing = {}
    for module, where in _imported_modules().items():
        if module == "mlxd" or module in sys.stdlib_module_names or module == "__future__":
            continue
        names = {_normalize(d) for d in dists.get(module, [module])}
        if not names & declared:
            missing[module] = where
    assert not missing, f"imported but not a runtime dependency: {missing}"


def test_httpx_is_a_runtime_dependency() -> None:
    assert "httpx" in _declared(extras=False)  # `mlxd bench run` needs it on a plain install
