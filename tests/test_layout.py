"""The layout holds: each floor imports only the floors below it (docs/ARCHITECTURE.md; imports inside
functions count too), and what `pip install .` (or `pip install -e .`) installs holds every package the
installed code imports: pyproject.toml's package list keeps up with the folders (a room left out works
from the checkout, then fails where the package is installed)."""
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


def _imports(source: Path):
    """The absolute imports of one file, those inside functions included."""
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


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
