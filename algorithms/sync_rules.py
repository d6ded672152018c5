"""The dense-replica sync rules of ShadowSync, as pure functions over parameter pytrees.

Zheng et al., "ShadowSync: Performing Synchronization in the Background for Highly Scalable
Distributed Training", arXiv 2003.03477. Symbols as in the paper: ``w_i`` the dense replica of
trainer i, ``wPS`` the sync parameter server's copy, ``a`` (alpha) the elastic / averaging
weight, ``g`` the BMUF global model, ``eta`` the block learning rate, ``n`` the trainers.

* S-EASGD (Alg. 2): ``wPS <- (1-a) wPS + a w_i;  w_i <- (1-a) w_i + a wPS``, in that order
  (the second line reads the new wPS: ``shadowsync.easgd_form=sequential``, the default), or
  both from the values before the sync (``simultaneous``, EASGD's elastic force).
* S-MA (Alg. 3): ``g <- allreduce(w_i) / n;  w_i <- (1-a) w_i + a g``.
* S-BMUF (Alg. 4): ``c <- allreduce(w_i) / n;  d <- c - g;  g <- g + eta d;
  w_i <- (1-a) w_i + a g``; with block momentum mu (Chen & Huo 2016):
  ``D <- mu D + eta d;  g <- g + D`` and, with Nesterov, ``w_i`` moves towards ``g + mu D``.

The shadow threads and the foreground (FR) workers call the same functions; each sync is one
fused jitted call (`SyncRule`), since dispatch serialises on the GIL (PERF_NOTES 5).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from recjax.config_async import SYNC_RULES

RULES = SYNC_RULES  # the names of the rules below (shadowsync.sync)


def _lerp(w, target, a):
    """(1 - a) w + a target, leaf-wise."""
    return jax.tree.map(lambda x, t: (1 - a) * x + a * t, w, target)


def easgd(w_ps, w_i, alpha: float, sequential: bool = True):
    """S-EASGD exchange (Alg. 2): returns ``(wPS', w_i')``.

    Sequential (the paper's Alg. 2, the default): ``wPS' = (1-a) wPS + a w_i``, then
    ``w_i' = (1-a) w_i + a wPS'``, the second line reading the new wPS. Simultaneous (the
    original EASGD's elastic force, Zhang et al. 2015): both from the old values. They differ:
    at ``a = 0.5`` (the ShadowSync study's) the simultaneous form leaves both equal to their
    average after every exchange, where Sec. 3 says the interpolation is asymmetric ("w_i and
    wPS are not equal after this update"); the sequential one gives ``w_i' = 0.75 w_i + 0.25
    wPS``. At ``a = 1`` the simultaneous form swaps the two; the sequential one copies w_i to
    the PS and keeps it.
    """
    ps = _lerp(w_ps, w_i, alpha)
    return ps, _lerp(w_i, ps if sequential else w_ps, alpha)


def tree_mean(trees: list) -> Any:
    """allreduce(w_i) / n, summed in the list's order (deterministic)."""
    total = trees[0]
    for t in trees[1:]:
        total = jax.tree.map(jnp.add, total, t)
    return jax.tree.map(lambda x: x / len(trees), total)


def ma(w_i, mean, alpha: float):
    """S-MA (Alg. 3) given ``mean = allreduce(w_i) / n``: ``w_i <- (1-a) w_i + a g``."""
    return _lerp(w_i, mean, alpha)


class BmufState(NamedTuple):
    """Attributes:
      g: the global model (identical on every trainer: all see the same allreduce).
      delta: block momentum D (zeros when momentum is off).
    """

    g: Any
    delta: Any


def bmuf_init(params) -> BmufState:
    return BmufState(params, jax.tree.map(jnp.zeros_like, params))


def bmuf(state: BmufState, c, w_i, alpha: float, eta: float, momentum: float = 0.0,
         nesterov: bool = False) -> tuple[BmufState, Any]:
    """S-BMUF (Alg. 4) given ``c = allreduce(w_i) / n``: returns ``(state', w_i')``.

    ``d <- c - g;  D <- mu D + eta d;  g <- g + D``; ``w_i <- (1-a) w_i + a target`` with
    target ``g`` (or ``g + mu D`` with Nesterov). With ``mu = 0``, ``D = eta d`` and this is the
    paper's ``g <- g + eta d``; with ``eta = 1`` as well, ``g = c`` and S-BMUF is S-MA.
    """
    d = jax.tree.map(jnp.subtract, c, state.g)
    delta = jax.tree.map(lambda D, dd: momentum * D + eta * dd, state.delta, d)
    g = jax.tree.map(jnp.add, state.g, delta)
    target = jax.tree.map(lambda gg, D: gg + momentum * D, g, delta) if nesterov else g
    return BmufState(g, delta), _lerp(w_i, target, alpha)


@dataclasses.dataclass(frozen=True)
class SyncRule:
    """A sync rule bound to its hyper-parameters, with its fused jitted pieces.

    Attributes:
      name: easgd | ma | bmuf | none.
      alpha: a.
      eta: BMUF block learning rate.
      momentum: BMUF block momentum mu.
      nesterov: BMUF Nesterov variant.
      sequential: S-EASGD's form: Alg. 2's two lines in order (True), or both from the old
        values (`easgd`).
    """

    name: str
    alpha: float
    eta: float = 1.0
    momentum: float = 0.0
    nesterov: bool = False
    sequential: bool = True

    def __post_init__(self):
        if self.name not in RULES:
            raise ValueError(f"--sync {self.name!r} is unknown; rules: {', '.join(RULES)}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"shadowsync.alpha must be in [0, 1], got {self.alpha}")

    @property
    def collective(self) -> bool:
        """MA and BMUF all-reduce among trainers; EASGD talks to a sync PS."""
        return self.name in ("ma", "bmuf")

    @property
    def exchange(self) -> Callable:
        """Jitted S-EASGD: ``(wPS, w_i) -> (wPS', w_i')``."""
        return _jit_easgd(self.alpha, self.sequential)

    @property
    def mean(self) -> Callable:
        """Jitted allreduce mean of a list of replicas."""
        return _jit_mean

    @property
    def local(self) -> Callable:
        """Jitted local half of MA/BMUF: ``(state, mean, w_i) -> (state', w_i')``."""
        if self.name == "ma":
            return _jit_ma(self.alpha)
        return _jit_bmuf(self.alpha, self.eta, self.momentum, self.nesterov)


@jax.jit
def _jit_mean(trees):
    return tree_mean(trees)


_cache: dict = {}


def _cached(key, make):
    if key not in _cache:
        _cache[key] = make()
    return _cache[key]


def _jit_easgd(alpha, sequential):
    return _cached(("easgd", alpha, sequential),
                   lambda: jax.jit(lambda ps, w: easgd(ps, w, alpha, sequential)))


def _jit_ma(alpha):
    return _cached(("ma", alpha), lambda: jax.jit(lambda s, mean, w: (s, ma(w, mean, alpha))))


def _jit_bmuf(alpha, eta, momentum, nesterov):
    return _cached(("bmuf", alpha, eta, momentum, nesterov), lambda: jax.jit(
        lambda s, c, w: bmuf(s, c, w, alpha, eta, momentum, nesterov)))
