"""python/b12x/_core.pyi names exactly what the extension exports."""

from __future__ import annotations

import ast
from pathlib import Path

import b12x
from b12x import _core


def stub_names() -> set[str]:
    tree = ast.parse((Path(b12x.__file__).parent / "_core.pyi").read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_stubs_and_extension_agree():
    exported = {n for n in dir(_core) if not n.startswith("__")} | {"__version__"}
    stubs = stub_names()
    assert exported - stubs == set(), "exported but not in _core.pyi"
    assert stubs - exported == set(), "in _core.pyi but not exported"
