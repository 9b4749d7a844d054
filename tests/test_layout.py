"""The layout holds: each floor imports only the floors below it (docs/ARCHITECTURE.md; imports inside
functions count too), no module imports itself through others (no import circle), and what `pip install .`
(or `pip install -e .`) installs holds every package the installed code imports: pyproject.toml's package
list keeps up with the folders (a room left out works from the checkout, then fails where the package is
installed)."""
from __future__ import annotations

import ast
from pathlib import Path

from setuptools.config.pyprojecttoml import read_configuration

ROOT = Path(__file__).resolve().parents[1]
BELOW = {  # top-level package -> the packages it may import besides itself
    "engines": set(),
    "text": {"engines"},
    "audio": {"engines"},
    "jobs": {"text", "audio", "engines"},
    "appliance": {"jobs", "text", "audio", "engines"},
}


def _package_of(module: str) -> str:
    """The deepest package folder of this tree that `module` names ("text.split" -> "text")."""
    parts = module.split(".")
    while parts and not (ROOT.joinpath(*parts) / "__init__.py").is_file():
        parts.pop()
    return ".".join(parts)


def _imports(source: Path, modules: bool = False):
    """The absolute imports of one file, those inside functions included; `modules`: `from a.b import c`
    counts as an import of `a.b.c` where that is a module of this tree (of `a.b` otherwise)."""
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if not modules:
                yield node.module
                continue
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                yield sub if _module_file(sub) else node.module


def _module_file(module: str):
    """The file of `module` in this tree (a module or a package's __init__.py), or None."""
    path = ROOT.joinpath(*module.split("."))
    for f in (path.with_suffix(".py"), path / "__init__.py"):
        if f.is_file():
            return f
    return None


def test_installed_code_imports_only_installed_packages():
    installed = set(read_configuration(ROOT / "pyproject.toml")["tool"]["setuptools"]["packages"])
    assert set(BELOW) <= installed, installed
    missing = set()
    for package in sorted(installed):
        for source in (ROOT / package.replace(".", "/")).glob("*.py"):
            for module in _imports(source):
                needed = _package_of(module)
                if needed and needed not in installed:
                    missing.add(f"{source.relative_to(ROOT)} imports {module}")
    assert not missing, ("not in pyproject.toml's [tool.setuptools.packages.find] include: "
                         + "; ".join(sorted(missing)))


def test_no_floor_imports_upwards():
    upwards = []
    for top, allowed in BELOW.items():
        for source in sorted((ROOT / top).rglob("*.py")):
            for module in _imports(source):
                other = _package_of(module).split(".")[0]
                if other and other != top and other not in allowed:
                    upwards.append(f"{source.relative_to(ROOT)} imports {module}")
    assert not upwards, "imports from a floor above (see docs/ARCHITECTURE.md): " + "; ".join(upwards)


def test_no_import_circle():
    """No module of the floors and benchmarks/ imports itself through others: imports at the top, inside
    functions and under TYPE_CHECKING all count (a circle hides which of two modules is the lower one)."""
    files = sorted(f for top in (*BELOW, "benchmarks") for f in (ROOT / top).rglob("*.py"))
    edges = {f: {m for m in map(_module_file, _imports(f, modules=True)) if m not in (None, f)} for f in files}

    def reach(f):  # every module `f` imports, directly or through others
        seen, todo = set(), list(edges[f])
        while todo:
            g = todo.pop()
            if g not in seen:
                seen.add(g)
                todo.extend(edges.get(g, ()))
        return seen

    reached = {f: reach(f) for f in files}
    circles = {" <-> ".join(sorted(str(g.relative_to(ROOT)) for g in reached[f] if f in reached[g]))
               for f in files if f in reached[f]}
    assert not circles, ("import circles (layer them: what both need in a module below both): "
                         + "; ".join(sorted(circles)))
