"""The dependency direction of shared/DESIGN.md, checked on every import statement of the tree
(top-level and inside functions alike): serving code never reaches the CLI or the benchmarks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "policies", "engines", "kernels", "bench")
# What each part may not import. gateway/cli is the composition root and may import anything.
FORBIDDEN = {
    "gateway": {"bench", "gateway.cli"},
    "policies": {"engines", "gateway", "kernels", "bench"},
    "engines": {"gateway", "policies", "bench"},
    "kernels": {"engines", "gateway", "policies", "bench"},
}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _part(path: Path) -> str | None:
    rel = path.relative_to(ROOT).parts
    if rel[:2] == ("gateway", "cli"):
        return None
    return rel[0] if rel[0] in FORBIDDEN else None


def _violations() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            part = _part(path)
            if part is None:
                continue
            for name in sorted(_imports(path)):
                for banned in FORBIDDEN[part]:
                    if name == banned or name.startswith(banned + "."):
                        found.append(f"{path.relative_to(ROOT)} imports {name}")
    return found


def test_imports_point_one_way():
    assert _violations() == []


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_is_checked(package):
    assert any((ROOT / package).rglob("*.py")), package
