"""What a study file declares: arms, sizes, claims (big_vision's config-as-a-file manner).

A study compares arms on the same seeds. Per seed, a *base* run (the reference arm's settings,
or `Study.base`'s) trains ``base`` steps and checkpoints; every arm continues from a copy of
that checkpoint in ``chunks`` segments of ``chunk`` steps (one ``--resume`` each, evaluated at
its end): the papers' protocol of switching a sync-trained model to another algorithm (GBA
Fig. 6), and a paired design (every arm of a seed shares the base model, the data order and the eval rows).
With ``back_at`` every arm but the reference also hands its checkpoint after that many chunks
back to the reference arm for the remaining chunks (GBA Fig. 6 d-f, "back to sync").
With ``base = 0`` every arm trains from scratch instead (the papers' protocol of comparing
whole runs, e.g. Persia Table 2), still paired: a seed fixes the init, the data order and the
eval rows of every arm; so does a scratch arm (`Arm.scratch`, a throughput sweep) at any size,
and a dataset may have its own schedule (`Size.schedules`).

A `Sweep` adds arms that differ in one setting (a table and a curve of the metric against it);
a claim may compare any two arms, on the study's metric or another summary key (`Study.metrics`),
as a difference or as a ratio (throughputs).

Settings are config overrides as the CLI writes them (``"gba.mode": "async"``), so a study file
reads like the commands it stands for and can be diffed against the paper's setup.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from recjax.study.stats import KINDS


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm. Attributes:
      name: its name in tables and files.
      overrides: config key -> value (as on the command line) on top of the study's.
      label: its legend in figures (default: the name).
      datasets: the datasets it runs on (default: every one).
      seeds: how many of the run's seeds it runs, the first ones (0: all): a measurement the
        seed does not change (virtual-clock throughput) needs two for its interval, not all.
      scratch: one whole run from scratch (its own length) even at a size with a base run: a
        throughput sweep, which shares no model with the other arms.
    """

    name: str
    overrides: dict = dataclasses.field(default_factory=dict)
    label: str = ""
    datasets: tuple[str, ...] = ()
    seeds: int = 0
    scratch: bool = False


@dataclasses.dataclass(frozen=True)
class Size:
    """The sizes of one variant (``smoke`` for tests, ``quick`` < 3 minutes, ``full``).

    Attributes:
      base: steps of each seed's shared base run; 0: no base run, every arm from scratch.
      chunk: steps per segment (one eval each); 0 (from scratch, one chunk): the config's own
        length (``train.epochs``).
      chunks: segments after the switch.
      seeds: the seeds (``train.seed``: init, data order, stragglers).
      back_at: chunks under an arm before it goes back to the reference arm (0: no back phase).
      overrides: config overrides of this size (data sizes, eval rows).
      datasets: dataset name -> config overrides of this size for that dataset only, after
        `overrides` (e.g. one dataset's epochs at this size).
      schedules: dataset name -> this size's schedule for that dataset (``base``, ``chunk``,
        ``chunks``, ``back_at``) where it differs (e.g. a small real dataset from scratch in
        one pass, where the synthetic task has a base run): `for_dataset`.
    """

    base: int
    chunk: int
    chunks: int
    seeds: tuple[int, ...]
    back_at: int = 0
    overrides: dict = dataclasses.field(default_factory=dict)
    datasets: dict = dataclasses.field(default_factory=dict)
    schedules: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        whole_run = self.base == 0 and self.chunks == 1  # may take the config's length
        if (min(self.base, self.chunk) < 0 or self.chunks < 1 or not self.seeds
                or (self.chunk < 1 and not whole_run)):
            raise ValueError(f"a study size needs base >= 0, chunk >= 1 (0 only for one chunk "
                             f"from scratch), chunks >= 1 and a seed: {self}")
        if not 0 <= self.back_at < self.chunks or (self.back_at and not self.base):
            raise ValueError(f"back_at={self.back_at} must be in [0, chunks={self.chunks}), and "
                             "0 without a base run")
        for ds, sched in self.schedules.items():
            if set(sched) - {"base", "chunk", "chunks", "back_at"}:
                raise ValueError(f"the schedule of {ds} sets {sorted(sched)}: only base, chunk, "
                                 "chunks and back_at")
            self.for_dataset(ds)  # each one valid

    def for_dataset(self, dataset: str) -> Size:
        """This size with `dataset`'s own schedule (`schedules`), if it has one."""
        sched = self.schedules.get(dataset)
        return dataclasses.replace(self, schedules={}, **sched) if sched else self


@dataclasses.dataclass(frozen=True)
class Sweep:
    """Arms that differ in one setting, named ``<name>=<value>``. Attributes:
      name: the swept quantity's name in tables (the paper's symbol).
      key: the config key it sets.
      values: size name -> the values at that size (a size not named runs none).
      overrides: the arms' other settings (on top of the study's).
      datasets: the datasets it runs on (default: every one).
      variant: what the arms hold fixed, as their names' prefix (``<variant> <name>=<value>``):
        several sweeps of one key (each algorithm against the number of trainers) then share
        one table per metric, a column each.
      scaled: config key -> size name -> an amount per unit of the swept value; each arm sets
        the key to amount x value (weak scaling: ``{"train.steps": {"quick": 120}}`` keeps
        each trainer's steps as the trainers grow).
      metrics: the summary keys its tables show (default: the study's metric); each one the
        study's metric or in `Study.metrics`.
      seeds: how many of the run's seeds its arms run (`Arm.seeds`; 0: all).
      scratch: its arms are whole runs from scratch (`Arm.scratch`).
    """

    name: str
    key: str
    values: dict
    overrides: dict = dataclasses.field(default_factory=dict)
    datasets: tuple[str, ...] = ()
    variant: str = ""
    scaled: dict = dataclasses.field(default_factory=dict)
    metrics: tuple[str, ...] = ()
    seeds: int = 0
    scratch: bool = False

    def arms(self, size: str | None = None) -> tuple[Arm, ...]:
        """Its arms at `size` (every size's, in value order, without the scaled keys, when
        None)."""
        vals = self.values.get(size, ()) if size else sorted({v for vs in self.values.values()
                                                             for v in vs})
        pre = f"{self.variant} " if self.variant else ""
        return tuple(Arm(f"{pre}{self.name}={v}",
                         {**self.overrides, self.key: v,
                          **{k: per[size] * v for k, per in self.scaled.items() if size in per}},
                         f"{pre}{self.name} = {v}", self.datasets, self.seeds, self.scratch)
                     for v in vals)


@dataclasses.dataclass(frozen=True)
class Claim:
    """A claim of the paper about ``arm - reference`` (or ``arm / reference``) on a metric,
    averaged over the chunks of a phase. Attributes:
      text: the claim, as the paper makes it.
      arm, reference: arm names.
      kind: less | greater (the arm is below / above by about `effect`) | within (|diff| <
        `effect`); `recjax.study.stats.verdict`.
      effect: the paper's effect (less: < 0; greater: > 0; ratio: the paper's ratio, < 1 or
        > 1), the margin (within), or None where the paper gives a direction without a size
        (did not hold only when the interval lies wholly on the other side of no effect).
      source: where the paper says it (table, figure, section).
      phase: forward (after the switch) | back (after switching back).
      metric: the summary key compared (default: the study's metric).
      scale: diff (``arm - reference`` per seed) | ratio (``arm / reference``, scored as the
        log ratio: a throughput claim such as "2.6x faster").
      datasets: the datasets it is scored on (default: every one).
    """

    text: str
    arm: str
    reference: str
    kind: str
    effect: float | None
    source: str
    phase: str = "forward"
    metric: str = ""
    scale: str = "diff"
    datasets: tuple[str, ...] = ()

    def __post_init__(self):
        if (self.kind not in KINDS or self.phase not in ("forward", "back")
                or self.scale not in ("diff", "ratio")):
            raise ValueError(f"claim {self.text!r}: kind must be one of {KINDS}, phase forward "
                             "or back, scale diff or ratio")
        if self.effect is not None and not math.isfinite(self.effect):
            raise ValueError(f"claim {self.text!r}: its effect must be a finite number (or None "
                             f"for a direction only), got {self.effect!r}")
        if self.scale == "ratio" and self.effect is not None and self.effect <= 0:
            raise ValueError(f"claim {self.text!r}: a ratio claim's effect is a ratio (> 0)")


@dataclasses.dataclass(frozen=True)
class Study:
    """A study. Attributes:
      name: its name (``scripts/compare.py NAME``; the files under ``--out``).
      title: the report's title.
      config: the named config it starts from (`recjax.configs`).
      overrides: config overrides of every arm.
      datasets: dataset name -> its overrides (a ``data.train`` path is resolved under
        $RECJAX_DATA; a dataset whose file is absent is skipped, and says so); the key
        ``config`` names the dataset's own named config (a size's ``config`` wins over it).
      arms: the arms; `reference` is one of them.
      reference: the no-switch arm (the base run's settings unless `base` is given; what
        `back_at` returns to).
      base: the base run's settings when they are not the reference arm's (ShadowSync: every
        arm continues from one single-trainer model); its records are named after it.
      sizes: ``smoke`` / ``quick`` / ``full`` -> `Size`.
      claims: the paper's claims this study scores.
      metric: the summary key compared (higher is better for AUC).
      counters: summary keys summed over an arm's chunks (a ``{"histogram": ...}`` value is
        merged: mean and max of the merged histogram); a dotted key reads a nested value
        (``lru.total.evicted``).
      notes: what the report says about the settings (the paper's numbers they scale).
      metrics: other summary keys kept per segment, shown as mean +- sd over seeds (a claim
        may compare one).
      sweeps: `Sweep`s (their arms join `arms` at the sizes they name).
      describe: a function of a dataset's config (the reference arm's, first seed) returning
        facts about its data (``{name: value}``), shown beside its results.
      overview: open the report with a table of every dataset: its facts and each arm's
        metric.
    """

    name: str
    title: str
    config: str
    overrides: dict
    datasets: dict
    arms: tuple[Arm, ...]
    reference: str
    sizes: dict
    claims: tuple[Claim, ...] = ()
    metric: str = "eval_auc"
    counters: tuple[str, ...] = ()
    notes: str = ""
    metrics: tuple[str, ...] = ()
    sweeps: tuple[Sweep, ...] = ()
    describe: Callable[[Any], dict] | None = None
    overview: bool = False
    base: Arm | None = None

    def __post_init__(self):
        names = [a.name for a in self.all_arms]
        if len(set(names)) != len(names) or self.reference not in [a.name for a in self.arms]:
            raise ValueError(f"study {self.name}: arm names must be unique and include the "
                             f"reference {self.reference!r}: {names}")
        if self.base is not None and self.base.name in names:
            raise ValueError(f"study {self.name}: the base run's name {self.base.name!r} is an "
                             "arm's; name it apart (its records are the base phase)")
        known = set(self.datasets)
        for a in self.all_arms:
            if set(a.datasets) - known:
                raise ValueError(f"study {self.name}: arm {a.name} names an unknown dataset")
        for c in self.claims:
            if {c.arm, c.reference} - set(names) or set(c.datasets) - known:
                raise ValueError(f"study {self.name}: claim {c.text!r} names an unknown arm "
                                 "or dataset")
            if c.metric and c.metric != self.metric and c.metric not in self.metrics:
                raise ValueError(f"study {self.name}: claim {c.text!r} compares {c.metric!r}, "
                                 "which is not in the study's metrics (not recorded)")
        for sw in self.sweeps:
            if set(sw.metrics) - {self.metric, *self.metrics}:
                raise ValueError(f"study {self.name}: sweep {sw.name} shows a metric not in the "
                                 f"study's metrics (not recorded): {sw.metrics}")
        for name, size in self.sizes.items():
            if set(size.datasets) - known:
                raise ValueError(f"study {self.name}: size {name} names an unknown dataset")

    @property
    def all_arms(self) -> tuple[Arm, ...]:
        """The arms and every sweep's arms (at any size)."""
        return self.arms + tuple(a for s in self.sweeps for a in s.arms())

    def arms_for(self, dataset: str, size: str) -> tuple[Arm, ...]:
        """The arms that run on `dataset` at `size`, in the study's order."""
        arms = self.arms + tuple(a for s in self.sweeps for a in s.arms(size))
        return tuple(a for a in arms if not a.datasets or dataset in a.datasets)

    def arm(self, name: str) -> Arm:
        return next(a for a in self.all_arms if a.name == name)

    @property
    def base_arm(self) -> Arm:
        """The base run's settings: `base`, else the reference arm."""
        return self.base or self.arm(self.reference)
