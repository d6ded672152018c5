"""What a study file declares: arms, sizes, claims (big_vision's config-as-a-file manner).

A study compares arms on the same seeds. Per seed, a *base* run (the reference arm's settings)
trains ``base`` steps and checkpoints; every arm continues from a copy of that checkpoint in
``chunks`` segments of ``chunk`` steps (one ``--resume`` each, evaluated at its end): the
papers' protocol of switching a sync-trained model to another algorithm (GBA Fig. 6), and a
paired design (every arm of a seed shares the base model, the data order and the eval rows).
With ``back_at`` every arm but the reference also hands its checkpoint after that many chunks
back to the reference arm for the remaining chunks (GBA Fig. 6 d-f, "back to sync").

Settings are config overrides as the CLI writes them (``"gba.mode": "async"``), so a study file
reads like the commands it stands for and can be diffed against the paper's setup.
"""

from __future__ import annotations

import dataclasses

from recjax.study.stats import KINDS


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm. Attributes:
      name: its name in tables and files.
      overrides: config key -> value (as on the command line) on top of the study's.
      label: its legend in figures (default: the name).
    """

    name: str
    overrides: dict = dataclasses.field(default_factory=dict)
    label: str = ""


@dataclasses.dataclass(frozen=True)
class Size:
    """The sizes of one variant (``smoke`` for tests, ``quick`` < 3 minutes, ``full``).

    Attributes:
      base: steps of each seed's shared base run.
      chunk: steps per segment (one eval each).
      chunks: segments after the switch.
      seeds: the seeds (``train.seed``: init, data order, stragglers).
      back_at: chunks under an arm before it goes back to the reference arm (0: no back phase).
      overrides: config overrides of this size (data sizes, eval rows).
    """

    base: int
    chunk: int
    chunks: int
    seeds: tuple[int, ...]
    back_at: int = 0
    overrides: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if min(self.base, self.chunk, self.chunks) < 1 or not self.seeds:
            raise ValueError(f"a study size needs base, chunk, chunks >= 1 and a seed: {self}")
        if not 0 <= self.back_at < self.chunks:
            raise ValueError(f"back_at={self.back_at} must be in [0, chunks={self.chunks})")


@dataclasses.dataclass(frozen=True)
class Claim:
    """A claim of the paper about ``arm - reference`` on the study's metric, averaged over the
    chunks of a phase. Attributes:
      text: the claim, as the paper makes it.
      arm, reference: arm names.
      kind: less | greater (the arm is below / above by about `effect`) | within (|diff| <
        `effect`); `recjax.study.stats.verdict`.
      effect: the paper's effect (less: < 0; greater: > 0) or the margin (within).
      source: where the paper says it (table, figure).
      phase: forward (after the switch) | back (after switching back).
    """

    text: str
    arm: str
    reference: str
    kind: str
    effect: float
    source: str
    phase: str = "forward"

    def __post_init__(self):
        if self.kind not in KINDS or self.phase not in ("forward", "back"):
            raise ValueError(f"claim {self.text!r}: kind must be one of {KINDS} and phase "
                             f"forward or back")


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
      reference: the no-switch arm (the base run's settings; what `back_at` returns to).
      sizes: ``smoke`` / ``quick`` / ``full`` -> `Size`.
      claims: the paper's claims this study scores.
      metric: the summary key compared (higher is better for AUC).
      counters: summary keys summed over an arm's chunks (a ``{"histogram": ...}`` value is
        merged: mean and max of the merged histogram).
      notes: what the report says about the settings (the paper's numbers they scale).
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

    def __post_init__(self):
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names) or self.reference not in names:
            raise ValueError(f"study {self.name}: arm names must be unique and include the "
                             f"reference {self.reference!r}: {names}")
        for c in self.claims:
            if {c.arm, c.reference} - set(names):
                raise ValueError(f"study {self.name}: claim {c.text!r} names an unknown arm")

    def arm(self, name: str) -> Arm:
        return next(a for a in self.arms if a.name == name)
