"""Run a study (`recjax.study.spec`): per dataset and seed, the base run, every arm chunk by
chunk, and the switches back; one record per segment, so a study that stops goes on where it
stopped when run again.

The algorithms are reached through the `run` function the entry point passes in
(``algorithms.run``: the registry's checks, checkpoint segments, no Ray process left), since
`recjax` imports no algorithm. Files under ``out``:

* ``<dataset>/segments.jsonl``: one record per finished segment (seed, arm, phase, chunk, a
  fingerprint of its settings, step, the metric, the counters); a segment with a record is not
  run again, and a record of other settings (another size, an edited study file) is an error;
* ``work/<dataset>/seed<S>/<arm>``: the run directories (checkpoints, the last summary.json);
  an arm starts as a copy of its seed's ``base`` (copied to a temporary name, then renamed), a
  switch back as a copy of the arm at chunk ``back_at``; with no base run (``Size.base = 0``)
  an arm starts in an empty directory, and so does a scratch arm (`Arm.scratch`: one whole run
  of its own length) at any size.

A segment cut short (Ctrl-C, a crash) is resumed from its directory's checkpoint; one whose
checkpoint reached its step before its record was written is read back from its summary.json.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable

from recjax import compile_cache, configs
from recjax.checkpoint import Checkpointer
from recjax.config import Config, apply_overrides
from recjax.data import memo
from recjax.data.sources import DataError, resolve_path
from recjax.runlog import read_summary
from recjax.study.spec import Arm, Size, Study
from recjax.train import signals
from recjax.train.contract import committed_steps, subtract_counts

RunFn = Callable[[Config], dict]


def dataset_overrides(study: Study, dataset: str) -> dict | None:
    """The dataset's overrides with its data paths (train, eval) resolved, or None when a file
    is absent."""
    over = dict(study.datasets[dataset])
    for key in ("data.train", "data.eval"):
        kind, sep, path = over.get(key, "").partition(":")
        if sep and kind != "synthetic":
            try:
                over[key] = f"{kind}:{resolve_path(path)}"
            except DataError:
                return None
    return over


def segment_config(study: Study, size: Size, data: dict, arm: Arm, seed: int, out: str,
                   steps: int, resume: bool, dataset: str = "") -> Config:
    """The config of one segment: the named config (the size's ``config``, else the dataset's,
    else the study's), then the study's, the dataset's, the size's (for all datasets, then for
    `dataset`) and the arm's settings, then the segment's own (seed, steps, where, resume).
    A whole run (`steps` 0) keeps a ``train.steps`` those settings give (an arm's own length)."""
    pairs = {**study.overrides, **data, **size.overrides, **size.datasets.get(dataset, {}),
             **arm.overrides}
    pairs = {**pairs, "train.seed": seed, "train.steps": steps or pairs.get("train.steps", 0),
             "train.out": out, "train.resume": resume, "train.progress": False}
    name = pairs.pop("config", study.config)
    return apply_overrides(configs.get(name),
                           [(k, v if isinstance(v, str) else json.dumps(v).strip('"'))
                            for k, v in pairs.items()])


def fingerprint(cfg: Config) -> str:
    """A short hash of a segment's settings (all but where it writes and whether it resumes):
    a record is reused only for the same settings."""
    d = json.loads(json.dumps(cfg.to_dict()))
    for k in ("out", "resume", "progress"):
        d["train"].pop(k, None)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def _get(summary: dict, key: str):
    """``summary[key]``; a dotted key reads a nested value (None where a level is absent)."""
    v = summary.get(key)
    if v is None and "." in key:
        v = summary
        for part in key.split("."):
            v = v.get(part) if isinstance(v, dict) else None
    return v


def _record(summary: dict, study: Study) -> dict:
    if study.metric not in summary:
        raise ValueError(f"study {study.name}: its metric {study.metric!r} is not in a run's "
                         f"summary; a summary has {', '.join(sorted(summary))}")
    row = {"step": summary["steps"], "resumed_from_step": summary.get("resumed_from_step"),
           study.metric: summary[study.metric],
           # 0: every eval prediction the same (a collapsed model; the report lists them)
           "eval_logit_spread": summary.get("eval_logit_spread")}
    for k in study.metrics:
        row[k] = _get(summary, k)
    for k in study.counters:
        v = _get(summary, k)
        row[k] = v["histogram"] if isinstance(v, dict) and "histogram" in v else v
    return row


def _copy(src: str, dst: str) -> None:
    """`src` to `dst` atomically (a temporary copy, then a rename)."""
    tmp = dst + ".copying"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns(".lock"))
    os.replace(tmp, dst)


def _run_counts(out: str, algo: str) -> dict | None:
    """The additive counters of `algo` over the whole run in `out` up to its latest checkpoint
    (`contract.Progress.counts`: a host-async summary's counters are the whole run's); {} with
    no checkpoint, None when it cannot be read."""
    directory = os.path.join(out, "checkpoints")
    done = committed_steps(directory)
    if not done:
        return {}
    ckpt = Checkpointer(directory)
    try:
        return ckpt.meta(done[-1]).get("progress", {}).get("counts", {}).get(algo, {})
    except OSError:
        return None
    finally:
        ckpt.close()


def _per_segment(row: dict, study: Study, before: dict | None, after: dict | None) -> dict:
    """`row` with each counter the run's checkpoints count over the whole run (``after``, at
    the segment's end) made this segment's own: less what they held at its start (``before``);
    None where either is unknown. Counters kept per call (the LRU store's) are left as read."""
    out = dict(row)
    for k in study.counters:
        if after is not None and k in after:
            out[k] = (None if before is None or row.get(k) is None
                      else subtract_counts({k: after[k]}, {k: before[k]} if k in before else {})[k])
    return out


def _run_segment(run: RunFn, cfg: Config, study: Study) -> dict:
    """Run one segment, or read it back if its checkpoint already reached its step (steps 0,
    the config's length: if its summary is of its last checkpoint); its counters are the
    segment's own (`_per_segment`)."""
    out, steps, algo = cfg.train.out, cfg.train.steps, cfg.train.algo
    done = committed_steps(os.path.join(out, "checkpoints"))
    if done and done[-1] >= steps:
        s, _ = read_summary(os.path.join(out, "summary.json"))
        if s is not None and s["steps"] == (steps or done[-1]):
            # run before its record was written: what its start held is gone
            return _per_segment(_record(s, study), study, None, _run_counts(out, algo))
        if steps and done[-1] == steps and cfg.train.algo != "single":
            # stopped between its last checkpoint and its summary: nothing is left to train,
            # and a host-async run refuses a checkpoint at its end; the single-device trainer
            # evaluates it (every algorithm checkpoints that layout).
            ev = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, algo="single"))
            row = _record(run(ev), study)
            # only the evaluation is that of the segment: its rates and counters are unknown
            return {**{k: (v if k in ("step", "resumed_from_step", study.metric)
                           or k.startswith("eval_") else None) for k, v in row.items()},
                    "evaluated_only": True}
    before = _run_counts(out, algo) if study.counters else {}
    row = _record(run(cfg), study)
    return _per_segment(row, study, before, _run_counts(out, algo)) if study.counters else row


def describe(study: Study, size_name: str, dataset: str) -> dict | None:
    """``study.describe`` of the dataset's config (the reference arm, the size's first seed),
    or None (no describe, or the data absent)."""
    data = dataset_overrides(study, dataset)
    if study.describe is None or data is None:
        return None
    size = study.sizes[size_name].for_dataset(dataset)
    return study.describe(segment_config(study, size, data, study.arm(study.reference),
                                         size.seeds[0], "", size.chunk, False, dataset))


def run_study(study: Study, size_name: str, out: str, run: RunFn,
              datasets: list[str] | None = None, seeds: tuple[int, ...] | None = None,
              log: Callable[[str], None] = print) -> dict:
    """Run (or finish) `study` at size `size_name` into `out`.

    Returns:
      ``{dataset: [segment records]}`` of every dataset whose data is present.
    """
    size: Size = study.sizes[size_name]
    seeds = tuple(seeds or size.seeds)
    compile_cache.enable("auto")  # every segment rebuilds its jitted functions: loads, not compiles
    memo.for_study()  # and opens its data afresh: the synthetic chunks are made once
    # a stop signal between segments, or one that came as a run finished (its trainer hands it
    # on: `signals.stop_requests`), stops the study at the next segment boundary
    with signals.stop_requests():
        return _run_study(study, size_name, out, run, datasets, seeds, log)


def planned(study: Study, size: Size, arms: tuple[Arm, ...], n_seeds: int) -> int:
    """The segments `_run_study` runs on one dataset: per seed its base run, each arm's
    chunks (a scratch arm's one run) on the seeds it runs, and every switched arm's chunks
    back."""
    n = 0
    for i in range(n_seeds):
        n += bool(size.base)
        for arm in arms:
            if arm.seeds and i >= arm.seeds:
                continue
            n += 1 if size.base and arm.scratch else size.chunks
            if size.back_at and arm.name != study.reference and not arm.scratch:
                n += size.chunks - size.back_at
    return n


class _Tally:
    """Where a study is: segments visited of `total`, and the seconds of those run here (for
    the estimate of what is left)."""

    def __init__(self, total: int):
        self.total, self.visited, self.ran, self.secs = total, 0, 0, 0.0

    def left(self) -> str:
        """``[k/total, ~M min left]``, the estimate from the segments run in this process."""
        eta = ""
        if self.ran:
            eta = f", ~{self.secs / self.ran * (self.total - self.visited) / 60:.0f} min left"
        return f"[{self.visited}/{self.total}{eta}]"


def _run_study(study: Study, size_name: str, out: str, run: RunFn,
               datasets: list[str] | None, seeds: tuple[int, ...],
               log: Callable[[str], None]) -> dict:
    ref, first = study.arm(study.reference), study.base_arm
    results = {}
    present = []
    for ds in datasets or list(study.datasets):
        data = dataset_overrides(study, ds)
        if data is None:
            log(f"{ds}: skipped, its data file {study.datasets[ds]['data.train']!r} is not under "
                "$RECJAX_DATA (default ../shared/data)")
            continue
        present.append((ds, data, study.sizes[size_name].for_dataset(ds),
                        study.arms_for(ds, size_name)))
    tally = _Tally(sum(planned(study, size, arms, len(seeds)) for _, _, size, arms in present))
    for ds, data, size, arms in present:
        segment = _Segments(study, size, ds, data, os.path.join(out, ds, "segments.jsonl"),
                            run, log, tally)
        for i, seed in enumerate(seeds):
            work = os.path.join(out, "work", ds, f"seed{seed}")
            base = os.path.join(work, "base")
            if size.base:
                segment(seed, first.name, "base", 0, base, size.base, first)
            for arm in arms:
                if arm.seeds and i >= arm.seeds:  # it runs on the first arm.seeds seeds only
                    continue
                d = os.path.join(work, arm.name)
                if size.base and arm.scratch:  # its own whole run, from scratch
                    segment(seed, arm.name, "forward", 1, d, 0, arm)
                    continue
                if size.base and not os.path.isdir(d):
                    _copy(base, d)
                for j in range(1, size.chunks + 1):
                    segment(seed, arm.name, "forward", j, d, size.base + j * size.chunk, arm)
                    back = os.path.join(work, arm.name + "-back")
                    if j == size.back_at and arm is not ref and not os.path.isdir(back):
                        at = size.base + j * size.chunk
                        if committed_steps(os.path.join(d, "checkpoints"))[-1:] != [at]:
                            raise RuntimeError(f"{d} is past step {at}, where {back} starts, "
                                               f"and {back} is missing: delete {work} to rerun "
                                               "this seed")
                        _copy(d, back)
            if size.back_at:
                for arm in arms:
                    if arm is ref or arm.scratch or (arm.seeds and i >= arm.seeds):
                        continue
                    d = os.path.join(work, arm.name + "-back")
                    for j in range(size.back_at + 1, size.chunks + 1):
                        segment(seed, arm.name, "back", j, d, size.base + j * size.chunk, ref)
        results[ds] = [r for r in segment.rows if r["seed"] in seeds]
    return results


class _Segments:
    """The segments of one dataset: ``self(seed, arm, phase, chunk, dir, steps, settings)``
    runs one unless its record exists, then appends its record."""

    def __init__(self, study: Study, size: Size, ds: str, data: dict, path: str, run: RunFn,
                 log: Callable[[str], None], tally: _Tally):
        self.study, self.size, self.ds, self.data, self.path = study, size, ds, data, path
        self.run, self.log, self.tally = run, log, tally
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.rows = _load(path)
        self.done = {(r["seed"], r["arm"], r["phase"], r["chunk"]): r.get("config")
                     for r in self.rows}

    def __call__(self, seed: int, arm: str, phase: str, chunk: int, d: str, steps: int,
                 settings: Arm) -> None:
        resume = bool(committed_steps(os.path.join(d, "checkpoints")))
        cfg = segment_config(self.study, self.size, self.data, settings, seed, d, steps, resume,
                             self.ds)
        key = (seed, arm, phase, chunk)
        self.tally.visited += 1
        if key in self.done:
            if self.done[key] != fingerprint(cfg):  # another size, or an edited study file
                raise ValueError(f"{self.path} holds {arm} {phase} chunk {chunk} of seed {seed} "
                                 "run under other settings (another size, or the study file "
                                 "changed since); use another --out, or delete that one")
            return
        if signals.requested():  # e.g. one that came as the previous segment finished
            raise KeyboardInterrupt
        t = time.perf_counter()
        row = {"seed": seed, "arm": arm, "phase": phase, "chunk": chunk,
               "config": fingerprint(cfg), **_run_segment(self.run, cfg, self.study),
               "secs": round(time.perf_counter() - t, 3)}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        self.rows.append(row)
        self.tally.ran += 1
        self.tally.secs += row["secs"]
        m = self.study.metric
        self.log(f"  {self.ds} seed {seed} {arm:<8} {phase:<7} chunk {chunk}: step "
                 f"{row['step']} {m} {row[m]:.4f} ({row['secs']:.1f}s) {self.tally.left()}")


def _load(path: str) -> list[dict]:
    """The records of `path`; a last line cut by a kill is removed (its segment reruns)."""
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        text = f.read()
    if text and not text.endswith(b"\n"):
        text = text[:text.rfind(b"\n") + 1]
        with open(path, "wb") as f:
            f.write(text)
    return [json.loads(line) for line in text.decode().splitlines() if line.strip()]
