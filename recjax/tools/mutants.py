"""Mutation testing of chosen modules with mutmut, each against only its own tests.

    python scripts/mutants.py                       # every group, the working tree
    python scripts/mutants.py metrics routing       # some groups
    python scripts/mutants.py --rev 738e4ce metrics # the tree of a commit (the "before" numbers)
    python scripts/mutants.py codec --only runs/before.json  # re-run only that report's survivors
    python scripts/mutants.py routing --tests tests/test_routing_props.py  # a quick first pass

Each group (a set of modules and the test files that exercise them) runs in its own copy of the
tree under ``--work`` with a generated ``setup.cfg``, so the repository gets no ``mutants/``
folder and no mutmut section. mutmut runs each mutant against the group's tests that reach the
mutated function (it records them on a first, clean run), one mutant at a time
(``--max-children 1``: the CI box has two cores), forked from a server that has imported and
collected the tests (15x faster than importing jax per mutant; the same verdicts as
``forkserver_warmup=none`` on the codec group). In the copy, hypothesis does not shrink a
failing example. Error-message text inside ``raise`` statements is not mutated: wording is not
behaviour; the conditions that raise are mutated. Per group it prints and writes (``--out``)
killed/total per module and the surviving mutants' diffs. docs/testing.md holds the numbers and
the survivors judged equivalent.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the repository

# group -> (modules to mutate, tests to run: files or node ids; absent ones are skipped)
GROUPS: dict[str, tuple[list[str], list[str]]] = {
    "metrics": (["recjax/metrics/auc.py", "recjax/metrics/logloss.py", "recjax/metrics/streaming.py"],
                ["tests/test_metrics.py", "tests/test_mutants_metrics.py"]),
    "sparse_optim": (["recjax/embeddings/sparse_optim.py"],
                     ["tests/test_embeddings.py", "tests/test_sparse_optim_props.py",
                      "tests/test_mutants_sparse_optim.py"]),
    "routing": (["sharding/routing.py"],
                ["tests/test_routing_props.py", "tests/test_sync.py::test_owner_routing",
                 "tests/test_mutants_routing.py"]),
    "codec": (["algorithms/runtime/codec.py"], ["tests/test_codec.py", "tests/test_mutants_codec.py"]),
    "dynamic": (["recjax/embeddings/dynamic.py"],
                ["tests/test_dynamic_store.py"]),
    "hashing": (["recjax/data/hashing.py"],
                ["tests/test_hashing_props.py", "tests/test_raw_ids.py", "tests/test_readers_props.py",
                 "tests/test_data_readers.py", "tests/test_mutants_hashing.py"]),
    "stragglers": (["algorithms/runtime/stragglers.py"],
                   ["tests/test_runtime.py::test_stragglers_are_seeded_and_parsed",
                    "tests/test_mutants_stragglers.py"]),
}
SOURCES = ["recjax", "sharding", "algorithms"]  # packages mutmut copies (the imports must resolve)
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped",
          36: "timeout", -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout",
          37: "caught by type check", -11: "segfault", -9: "segfault", None: "not checked"}

# Appended to the copy's tests/conftest.py: hypothesis stops at the first failing example
# instead of shrinking it (a killed mutant needs no minimal example; shrinking, a jit compile
# per try, is what made killed mutants time out).
NO_SHRINK = """
from hypothesis import Phase as _Phase
from hypothesis import settings as _settings

_settings.register_profile("mutants", phases=(_Phase.explicit, _Phase.reuse, _Phase.generate))
_settings.load_profile("mutants")
"""


def tree_copy(dest: pathlib.Path, rev: str | None) -> None:
    """The repository's files (a commit's, or the working tree's tracked and untracked ones)."""
    if rev:
        with tempfile.TemporaryFile() as f:
            subprocess.run(["git", "archive", rev], cwd=ROOT, stdout=f, check=True)
            f.seek(0)
            with tarfile.open(fileobj=f) as tar:
                tar.extractall(dest, filter="data")
        return
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def setup_cfg(modules: list[str], tests: list[str]) -> str:
    lines = ["[mutmut]", "source_paths=", *(f"    {s}" for s in SOURCES), "only_mutate=",
             *(f"    {m}" for m in modules), "pytest_add_cli_args_test_selection=",
             *(f"    {t}" for t in tests), "pytest_add_cli_args=", "    -p", "    no:cacheprovider",
             "do_not_mutate_patterns=", r"    ^\s*raise\s", "process_isolation=forkserver",
             "forkserver_warmup=collect"]
    return "\n".join(lines) + "\n"


def locate(source: list[str], key: str, diff: str) -> str:
    """``line: - old  + new`` of a mutant: the first line after its function's ``def`` that
    equals the line `mutmut show`'s diff removes."""
    func = key.rsplit("__mutmut_", 1)[0].split(".")[-1].split("\u01c1")[-1]  # x_name, xǁClassǁname
    func = func[2:] if func.startswith("x_") else func
    minus = [x[1:].strip() for x in diff.splitlines() if x.startswith("-") and not x.startswith("---")]
    plus = [x[1:].strip() for x in diff.splitlines() if x.startswith("+") and not x.startswith("+++")]
    start = next((i for i, x in enumerate(source) if x.strip().startswith(f"def {func}(")), 0)
    line = next((i + 1 for i in range(start, len(source)) if minus and source[i].strip() == minus[0]),
                "?")
    return f"{line}: - {' / '.join(minus)}  + {' / '.join(plus)}"


def run_group(name: str, work: pathlib.Path, rev: str | None, timeout: float,
              only: list[str] | None = None, tests: list[str] | None = None) -> dict:
    modules, tests = GROUPS[name][0], tests or GROUPS[name][1]
    d = work / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    tree_copy(d, rev)
    tests = [t for t in tests if (d / t.split("::")[0]).exists()]
    (d / "setup.cfg").write_text(setup_cfg(modules, tests))
    with open(d / "tests" / "conftest.py", "a") as f:  # the copy's: a failing example is enough
        f.write(NO_SHRINK)
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONHASHSEED="0")
    log = d / "mutmut.log"
    with open(log, "w") as f:
        proc = subprocess.run(["mutmut", "run", "--max-children", "1", *(only or [])], cwd=d,
                              env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    if proc.returncode:
        sys.exit(f"mutants: mutmut failed on group {name!r} (exit {proc.returncode}); see {log}")
    out = {"tests": tests, "modules": {}}
    for m in modules:
        meta = json.loads((d / "mutants" / (m + ".meta")).read_text())
        by_status: dict[str, list[str]] = {}
        codes = {k: c for k, c in meta["exit_code_by_key"].items() if only is None or k in only}
        for key, code in codes.items():
            by_status.setdefault(STATUS.get(code, "suspicious"), []).append(key)
        source = (d / m).read_text().splitlines()
        survivors = {}
        for k in sorted(by_status.get("survived", [])):
            diff = subprocess.run(["mutmut", "show", k], cwd=d, env=env, capture_output=True,
                                  text=True).stdout
            survivors[k] = {"where": f"{m}:{locate(source, k, diff)}", "diff": diff}
        total = len(codes)
        killed = len(by_status.get("killed", [])) + len(by_status.get("timeout", []))
        out["modules"][m] = {"total": total, "killed": killed,
                             "counts": {s: len(v) for s, v in by_status.items()},
                             "survivors": survivors}
        print(f"{m}: {killed}/{total} killed  {out['modules'][m]['counts']}", flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("groups", nargs="*", help=f"groups to run (default: all of {', '.join(GROUPS)})")
    ap.add_argument("--rev", help="mutate the tree of this commit instead of the working tree")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "recjax-mutants"),
                    help="scratch folder for the per-group copies")
    ap.add_argument("--out", default="runs/mutants.json", help="JSON report (with survivor diffs)")
    ap.add_argument("--timeout", type=float, default=3 * 3600, help="seconds per group")
    ap.add_argument("--only", metavar="REPORT", help="run only the mutants that survived in this "
                    "earlier --out report (a quick re-check after new tests; counts are of those)")
    ap.add_argument("--tests", help="comma-separated test files or node ids to run instead of the "
                    "group's (a quicker first pass; re-check its survivors with the group's own "
                    "tests through --only)")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.groups) - set(GROUPS))
    if unknown:
        ap.error(f"unknown group(s) {unknown}; choose from {', '.join(GROUPS)}")
    report = {"rev": args.rev or "working tree", "only": args.only, "tests": args.tests,
              "groups": {}}
    earlier = json.loads(pathlib.Path(args.only).read_text())["groups"] if args.only else None
    for g in args.groups or list(GROUPS):
        only = None
        if earlier is not None:
            if g not in earlier:
                ap.error(f"--only {args.only}: no group {g!r} in it (it has {', '.join(earlier)})")
            only = [k for m in earlier[g]["modules"].values() for k in m["survivors"]]
            if not only:
                print(f"{g}: no survivors in {args.only}; nothing to run", flush=True)
                continue
        report["groups"][g] = run_group(g, pathlib.Path(args.work), args.rev, args.timeout, only,
                                       args.tests.split(",") if args.tests else None)
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"report: {args.out}")


if __name__ == "__main__":
    main()
