"""The benchmark and device scripts run where CI cannot (a GPU): at least every warmd name they
import must exist, so a refactor cannot break them unnoticed."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parent.parent / "scripts").glob("*.py"))


def _warmd_imports(path: Path) -> list[tuple[str, str | None]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("warmd"):
            out += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            out += [(alias.name, None) for alias in node.names if alias.name.startswith("warmd")]
    return out


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_warmd_name_a_script_imports_exists(script):
    for module, name in _warmd_imports(script):
        imported = importlib.import_module(module)
        assert name is None or hasattr(imported, name) or importlib.util.find_spec(
            f"{module}.{name}"), f"{script.name}: from {module} import {name}"
