"""The host-async engine as seams (issue 34, step 3; DESIGN.md section 4.2): where PS shards and
compute live is one placement (``algorithms/runtime/placement.py``, ``ray_placement.py``),
chosen once, so neither an algorithm nor the engine asks which backend runs or reaches Ray
but through it; the part that runs the roles stays readable in one sitting.

Read from the source (no run): a new ``if backend == ...`` or ``cluster is None`` outside the
placement modules, an import of a Ray module by the engine or an algorithm, or a file past its
limit fails here, naming the file and line."""

import ast
import inspect
import pathlib

from algorithms.runtime import placement, ray_placement
from tests.test_import_graph import import_graph

ROOT = pathlib.Path(__file__).resolve().parents[1]
RUNTIME = ROOT / "algorithms" / "runtime"
# the modules that may know which placement runs: the placements themselves and Ray's parts
PLACEMENT = {"placement.py", "reaper.py"} | {p.name for p in RUNTIME.glob("ray_*.py")}
ENGINE_AND_ALGORITHMS = sorted([*(ROOT / "algorithms").glob("*.py"), *RUNTIME.glob("*.py")])
BACKEND_WORDS = {"backend", "cluster", "dense_on_actor"}  # names that tell placements apart
FILE_LIMIT = 450  # lines of any engine file (clock.py, a model kept whole, is under it)
RUNTIME_LIMIT = 300  # lines of the class that runs the roles


def _words(node: ast.AST) -> set[str]:
    """The names, attributes and string constants in `node`."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.add(n.value)
    return out


def backend_tests(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """``file:line`` of each condition in `path` that looks at the backend: a test (if, while,
    a conditional expression, a boolean operator or a comparison) that names the backend or a
    Ray cluster, or compares with ``"ray"``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        tests = []
        if isinstance(node, (ast.If, ast.IfExp, ast.While, ast.Assert)):
            tests = [node.test]
        elif isinstance(node, (ast.BoolOp, ast.Compare)):
            tests = [node]
        elif isinstance(node, ast.comprehension):
            tests = node.ifs
        for t in tests:
            words = _words(t)
            if words & BACKEND_WORDS or "ray" in words or any(w.startswith("Ray") for w in words):
                found.append(f"{path.relative_to(root)}:{t.lineno}")
    return sorted(set(found))


def test_the_check_finds_a_hand_made_branch(tmp_path):
    src = tmp_path / "x.py"
    src.write_text("def f(rt, cfg):\n"
                   "    if rt.cluster is None:\n        return 1\n"
                   "    y = 2 if cfg.runtime.backend == 'ray' else 3\n"
                   "    return [w for w in rt.workers if isinstance(w, RayWorker)], y\n")
    assert backend_tests(src, tmp_path) == ["x.py:2", "x.py:4", "x.py:5"]


def test_no_engine_or_algorithm_module_tests_the_backend():
    found = [hit for p in ENGINE_AND_ALGORITHMS if p.name not in PLACEMENT
             for hit in backend_tests(p)]
    assert found == [], "ask the run's placement (algorithms/runtime/placement.py) instead"


def test_ray_is_reached_through_the_placement_only():
    """Only the placement modules import a Ray module (``ray_*.py``); the benchmarks in
    algorithms/tools measure Ray's pieces themselves and may."""
    graph = import_graph()
    found = sorted((m, d) for m, deps in graph.items() for d in deps
                   if d.startswith("algorithms.runtime.ray_")
                   and m.startswith("algorithms") and not m.startswith("algorithms.tools")
                   and m.rpartition(".")[2] + ".py" not in PLACEMENT)
    assert found == []


def test_every_placement_has_the_interface():
    """`InProcess` and `RayPlacement` both carry every member of `placement.Placement`, with
    its parameters, so the engine can call either."""
    members = [n for n, v in vars(placement.Placement).items()
               if callable(v) and not n.startswith("_")]
    assert {"make_ps", "host", "worker", "beside", "companion", "remote_fn", "warm", "check",
            "diagnose", "fault_counters", "close"} <= set(members)
    for impl in (placement.InProcess, ray_placement.RayPlacement):
        for name in ("name", "tables_here", "data_here", "stop_saving", "final_tables",
                     "step_poll_s"):
            assert name in vars(impl) or name in inspect.getsource(impl.__init__), (impl, name)
        for name in members:
            want = list(inspect.signature(getattr(placement.Placement, name)).parameters)
            got = list(inspect.signature(getattr(impl, name)).parameters)
            assert got == want, (impl.__name__, name)


def test_engine_files_and_the_runtime_stay_readable():
    """No engine file past 450 lines; `Runtime`, the part that runs the roles, within 300."""
    long = {p.name: n for p in RUNTIME.glob("*.py")
            if (n := len(p.read_text().splitlines())) > FILE_LIMIT}
    assert long == {}
    tree = ast.parse((RUNTIME / "engine.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Runtime")
    assert cls.end_lineno - cls.lineno + 1 <= RUNTIME_LIMIT
