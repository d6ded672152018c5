"""Paired statistics and the verdict rule every study uses.

A study runs each arm on the same seeds (same base checkpoint, data order and eval rows per
seed), so its evidence for a claim is the per-seed difference ``d_s = arm_s - reference_s``.
`paired` summarises those: the mean, the Student-t interval and the minimum detectable effect
(MDE: the smallest true difference a two-sided test at level `alpha` detects with probability
`power`, ``(t_{1-alpha/2} + t_{power}) * SE`` with n - 1 degrees of freedom).

`verdict` says what the data can say about a claim the paper makes:

* ``less`` / ``greater`` (the arm is below / above the reference by about the paper's
  `effect`): **did not hold** when the (1 - alpha) interval excludes the paper's effect on the
  side of no effect (the data rule an effect that large out, even where they show a smaller one
  of the paper's sign: the claim is its size); **held** when the interval excludes 0 on the
  paper's side (and so does not rule the paper's effect out); otherwise **unresolved**. Two seed
  sets of the GBA study disagreed under the first draft of this rule, which called "held" an
  interval that excluded both 0 and the paper's effect.
* ``less`` / ``greater`` without an effect (the paper gives a direction, e.g. a bound that
  grows with a setting, not a size): **did not hold** only when the interval lies wholly on the
  other side of 0; **held** when it excludes 0 on the paper's side; otherwise **unresolved**.
* ``within`` (the arm is within ``+-effect`` of the reference, e.g. "GBA within 0.001 AUC of
  sync"): an equivalence test (two one-sided tests): **held** when the (1 - 2 alpha) interval
  lies inside ``(-effect, effect)``; **did not hold** when the (1 - alpha) interval lies wholly
  outside it; otherwise **unresolved**.

One seed has no interval: every claim on one seed is unresolved (its MDE is infinite).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from scipy import stats as _st

HELD, NOT_HELD, UNRESOLVED = "held", "did not hold", "unresolved"
KINDS = ("less", "greater", "within")


@dataclasses.dataclass(frozen=True)
class Paired:
    """Summary of per-seed paired differences.

    Attributes:
      n: seeds.
      mean: mean difference.
      sd: their sample standard deviation (nan for n < 2).
      lo, hi: the two-sided (1 - alpha) Student-t interval of the mean (-inf, inf for n < 2).
      mde: minimum detectable effect at `alpha` and `power` (inf for n < 2).
      alpha: the test level.
    """

    n: int
    mean: float
    sd: float
    lo: float
    hi: float
    mde: float
    alpha: float


def paired(diffs: Sequence[float], alpha: float = 0.05, power: float = 0.8) -> Paired:
    """Mean, (1 - alpha) t-interval and MDE of the per-seed differences `diffs`."""
    d = [float(x) for x in diffs]
    n = len(d)
    if n == 0:
        raise ValueError("paired: no differences (no seed finished both arms)")
    mean = sum(d) / n
    if n < 2:
        return Paired(n, mean, math.nan, -math.inf, math.inf, math.inf, alpha)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    se = sd / math.sqrt(n)
    t = float(_st.t.ppf(1 - alpha / 2, n - 1))
    mde = (t + float(_st.t.ppf(power, n - 1))) * se
    return Paired(n, mean, sd, mean - t * se, mean + t * se, mde, alpha)


def verdict(kind: str, effect: float | None, diffs: Sequence[float], alpha: float = 0.05
            ) -> tuple[str, Paired]:
    """``(verdict, summary)`` of a claim of `kind` with the paper's `effect` (see the module
    docstring); for ``within``, `effect` is the margin (> 0); None: a direction, no size.

    Raises:
      ValueError: an unknown kind, or an effect of the wrong sign for it.
    """
    if kind not in KINDS:
        raise ValueError(f"claim kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if effect is None:
        if kind == "within":
            raise ValueError("a 'within' claim needs its margin (> 0), got None")
        effect = 0.0  # a direction: only the other side of 0 rules it out
    elif (kind == "less" and effect >= 0) or (kind in ("greater", "within") and effect <= 0):
        raise ValueError(f"a {kind!r} claim needs an effect "
                         f"{'< 0' if kind == 'less' else '> 0'}, got {effect}")
    p = paired(diffs, alpha)
    if kind == "within":
        tost = paired(diffs, 2 * alpha)  # the (1 - 2 alpha) interval of the two one-sided tests
        if -effect < tost.lo and tost.hi < effect:
            return HELD, p
        if p.lo > effect or p.hi < -effect:
            return NOT_HELD, p
        return UNRESOLVED, p
    if (kind == "less" and p.lo > effect) or (kind == "greater" and p.hi < effect):
        return NOT_HELD, p
    if (kind == "less" and p.hi < 0) or (kind == "greater" and p.lo > 0):
        return HELD, p
    return UNRESOLVED, p
