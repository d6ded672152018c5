"""The import graph of recjax/, sharding/, algorithms/ and scripts/ (DESIGN.md section 2):
imports flow one way, ``scripts -> algorithms -> sharding -> recjax``, and no module imports
itself through others. Every import counts, a lazy one inside a function too.

The few exceptions left are listed with the step that removes them; the test fails on any new
one and on a listed one that is gone (shorten the list then)."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("recjax", "sharding", "algorithms", "scripts")  # lower layers first
KNOWN_CYCLES: list[set[str]] = []  # none: the test fails on the first one
KNOWN_UPWARD = {
    # recjax.fit, the library's one call, runs an algorithm (algorithms.run) by its registry row
    ("recjax.api", "algorithms"),
}


def _module(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of the four packages it imports (an import of a name inside a
    module counts as an import of that module)."""
    mods = {_module(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for mod, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {known(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        pkg = pkg.rpartition(".")[0]
                    base = f"{pkg}.{base}" if base else pkg
                deps |= {known(f"{base}.{a.name}") or known(base) for a in node.names}
        graph[mod] = deps - {None, mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycles_finds_a_hand_made_one():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(g) == [{"a", "b", "c"}]


def test_no_import_cycle_but_the_known_ones():
    found = cycles(import_graph())
    assert [c for c in found if c not in KNOWN_CYCLES] == []
    assert [c for c in KNOWN_CYCLES if c not in found] == [], "a known cycle is gone: drop it"


def test_imports_flow_one_way():
    layer = {p: i for i, p in enumerate(PACKAGES)}
    upward = {(m, d.split(".")[0]) for m, deps in import_graph().items() for d in deps
              if layer[d.split(".")[0]] > layer[m.split(".")[0]]}
    assert upward == KNOWN_UPWARD


def test_the_library_imports_no_script():
    """Scripts are entry points: the library never imports one."""
    graph = import_graph()
    assert not [(m, d) for m, deps in graph.items() if not m.startswith("scripts")
                for d in deps if d.startswith("scripts")]


def test_no_test_imports_a_script():
    """Tests call the library (a script's body lives there) or run a script as a user does."""
    found = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [(path.name, n) for n in names if n.split(".")[0] == "scripts"]
    assert found == []


def _declares(fn: ast.FunctionDef) -> bool:
    """`fn` is a docstring (optional) and one ``return``: a declaration's shorthand."""
    body = [n for n in fn.body if not (isinstance(n, ast.Expr)
                                        and isinstance(n.value, ast.Constant))]
    return len(body) == 1 and isinstance(body[0], ast.Return)


def test_every_script_is_an_entry_point_and_scripts_stay_small():
    """STYLE rule 8: a file in scripts/ is a thin entry point (a ``__main__`` guard; at most a
    ``main`` of its own, its body in the library) or a declarative study file (no code but
    its declarations: a helper there is one ``return`` of a declaration); scripts/ in all under
    2,000 lines (issue 34)."""
    bodies, lines = [], 0
    for path in sorted((ROOT / "scripts").rglob("*.py")):
        tree = ast.parse(path.read_text())
        lines += len(path.read_text().splitlines())
        study = path.parent.name == "studies"
        defs = [n.name for n in ast.walk(tree) if isinstance(
            n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and not (study and isinstance(n, ast.FunctionDef) and _declares(n))]
        guard = any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)
        if path.name == "__init__.py":
            continue
        if (study and defs) or (not study and (not guard or set(defs) - {"main"})):
            bodies.append((path.name, defs, guard))
    assert bodies == []
    assert lines < 2000
