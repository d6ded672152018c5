"""A family of modes is a table of rules read by one path (STYLE.md, "Registries and modes"):
`algorithms/gba.py` and `algorithms/persia.py` tell their modes apart only in `MODES`.

The check reads the source: no comparison of a ``mode`` (``p.mode == "sync"``,
``mode in (...)``) and no mode name as a string outside the ``MODES`` table and docstrings,
so a new ``if`` on the mode's name fails here instead of growing a ladder again.
"""

import ast
import pathlib

import pytest

from recjax.config_async import GBA_MODES, PERSIA_MODES

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _is_mode(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "mode") or (
        isinstance(node, ast.Name) and node.id == "mode")


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _modes_table(tree: ast.Module) -> ast.AST:
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "MODES":
            return node
    raise AssertionError("no MODES table")


@pytest.mark.parametrize("path,modes", [("algorithms/gba.py", GBA_MODES),
                                        ("algorithms/persia.py", PERSIA_MODES)])
def test_modes_are_told_apart_in_the_table_only(path, modes):
    tree = ast.parse((ROOT / path).read_text())
    table = {id(n) for n in ast.walk(_modes_table(tree))}
    docs = _docstrings(tree)
    compares = [f"{path}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Compare)
                and any(_is_mode(x) for x in [n.left, *n.comparators])]
    assert not compares, f"the mode's name is compared at {compares}: read its MODES row instead"
    names = [f"{path}:{n.lineno} {n.value!r}" for n in ast.walk(tree)
             if isinstance(n, ast.Constant) and n.value in modes
             and id(n) not in table and id(n) not in docs]
    assert not names, f"a mode's name outside MODES at {names}: read its row instead"
