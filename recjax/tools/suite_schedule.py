"""Replay a test run's durations through pytest-xdist's schedulers: how long each worker would
be busy, so that a scheduler (``--dist load``, the default, or ``worksteal``) or a test order can
be chosen from one measured run instead of one 56-minute run per choice.

    python -m pytest -q -n 2 -m "" --durations=0 > run.log       # durations of every test
    python -m pytest -q -m "" --collect-only > order.txt         # the collection order
    python scripts/suite_schedule.py run.log order.txt --workers 2

The model follows pytest-xdist 3.x (`xdist/scheduler/load.py`, `worksteal.py`):

* ``load``: each worker first gets a run of ``max(n // workers // 4, 2)`` consecutive
  tests; when a worker's queue falls below ``max(2, pending // workers // 4)`` after a test it is
  filled to ``max(2, pending // workers // 2)``, unless that test took >= 0.1 s and it still
  holds 2. What a worker holds stays there: the other may run out and wait.
* ``worksteal``: the tests are split into one consecutive run per worker; a worker whose queue
  falls below 2 takes the later half of the longest queue (keeping 2 there).

A test's duration is its setup, call and teardown as ``--durations=0`` lists them (phases under
``--durations-min``, 5 ms by default, count as 0); nothing between tests is modelled.
"""

from __future__ import annotations

import argparse
import collections
import re
from collections.abc import Iterable, Sequence

MIN_PENDING = 2  # xdist's worksteal: a worker with fewer queued tests asks for more

_LINE = re.compile(r"\s*([\d.]+)s (?:setup|call|teardown)\s+(\S.*?)\s*$")


def durations(lines: Iterable[str]) -> dict[str, float]:
    """``{test id: seconds}``: the phases of each test in a ``--durations=0`` report, summed."""
    out: dict[str, float] = collections.defaultdict(float)
    for line in lines:
        m = _LINE.match(line)
        if m:
            out[m[2]] += float(m[1])
    return dict(out)


def order(lines: Iterable[str]) -> list[str]:
    """The test ids of a ``--collect-only -q`` listing, in its order."""
    return [line.strip() for line in lines if "::" in line and not line.startswith(" ")]


def load(d: Sequence[float], workers: int = 2) -> list[list[int]]:
    """The tests (indices into `d`) each worker runs under ``--dist load``, in its order."""
    return _replay(d, workers, "load")


def worksteal(d: Sequence[float], workers: int = 2) -> list[list[int]]:
    """The same under ``--dist worksteal``."""
    return _replay(d, workers, "worksteal")


def busy(d: Sequence[float], ran: list[list[int]]) -> list[float]:
    """Seconds each worker is busy; the run's wall is about the largest."""
    return [sum(d[i] for i in r) for r in ran]


def _replay(d: Sequence[float], workers: int, dist: str) -> list[list[int]]:
    n = len(d)
    queue: list[list[int]] = [[] for _ in range(workers)]
    if dist == "load":
        pending = list(range(n))
        first = max(n // workers // 4, 2)
        for w in range(workers):
            queue[w], pending = pending[:first], pending[first:]
    else:
        pending = []
        for w in range(workers):
            queue[w] = list(range(w * n // workers, (w + 1) * n // workers))
    clock = [0.0] * workers  # when each worker started the test it runs (or went idle)
    ran: list[list[int]] = [[] for _ in range(workers)]
    while any(queue):  # the next test to end, and what the scheduler does then
        w = min((v for v in range(workers) if queue[v]), key=lambda v: (clock[v] + d[queue[v][0]], v))
        i = queue[w].pop(0)
        clock[w] += d[i]
        ran[w].append(i)
        if dist == "load":
            if pending:
                least = max(2, len(pending) // workers // 4)
                most = max(2, len(pending) // workers // 2)
                if len(queue[w]) < least and not (d[i] >= 0.1 and len(queue[w]) >= 2):
                    k = most - len(queue[w])
                    queue[w] += pending[:k]
                    del pending[:k]
            continue
        for v in range(workers):
            if len(queue[v]) >= MIN_PENDING:
                continue
            victim = max(range(workers), key=lambda u: len(queue[u]))
            k = min(len(queue[victim]) // 2, max(0, len(queue[victim]) - MIN_PENDING))
            if k:  # (never to an idle worker: its queue ran out where it could take none)
                queue[v] += queue[victim][-k:]
                del queue[victim][-k:]
    return ran


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log", help="a pytest run's output with --durations=0")
    p.add_argument("order", help="pytest --collect-only -q output of the same selection")
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args(argv)
    with open(a.log) as f:
        took = durations(f)
    with open(a.order) as f:
        ids = order(f)
    if not ids:
        raise SystemExit(f"{a.order}: no test ids (expected `pytest --collect-only -q` output)")
    left = len(set(took) - set(ids))
    if left:  # a log of a wider selection replays this one
        print(f"{left} tests of {a.log} are not in {a.order}: left out")
    unknown = sum(t not in took for t in ids)
    if unknown:
        print(f"{unknown} tests of {a.order} have no listed duration in {a.log} (every "
              "phase under --durations-min): 0 s")
    d = [took.get(t, 0.0) for t in ids]
    print(f"{len(ids)} tests, {sum(d):.0f} worker-seconds, {sum(d) / a.workers:.0f} s per "
          f"worker if shared evenly")
    for dist, fn in (("load", load), ("worksteal", worksteal)):
        b = busy(d, fn(d, a.workers))
        print(f"--dist {dist:9s} workers busy " + ", ".join(f"{x:.0f}" for x in b)
              + f" s: wall ~{max(b):.0f} s")
    return 0
