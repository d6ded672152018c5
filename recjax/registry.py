"""The algorithm registry: one row per ``--algo``, and every list of algorithms derived from it.

A row names what runs the algorithm (``"module:function"``, imported only when it runs, so
this module and the config import no algorithm), its kind, the config sections that are its
own settings (a ``--resume`` may switch them: the hand-over of GBA's sync <-> async, Su et al.
2022 Sec. 4.1), and the capabilities it has. The config's ``train.algo`` choices,
``--help-config``, the CLI's help, the resume rules (`handover_sections`), the engine's list of
host-async algorithms and the refusal of a flag an algorithm cannot honour (`RULES`, read by
`check`) all come from here.

Adding an algorithm: a row in `ALGORITHMS` (and, if it has settings of its own, its config
section); nothing else lists algorithms.

It lives in `recjax`, not in ``algorithms/`` where DESIGN.md section 2 draws it: the config,
the CLI and the resume contract read it, and `recjax` imports no algorithm, so the rows are
data and name their ``run`` by module path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

SINGLE, SPMD, HOST_ASYNC = "single", "spmd", "host_async"  # the kinds of algorithm

# capability -> what it lets an algorithm do (read by the refusals in `RULES`)
CAPABILITIES = {
    "train_mode": "run the training-mode forward pass",
    "in_loop_eval": "evaluate during training, with early stopping and the best checkpoint",
    "lru_store": "keep dynamic ids in an LRU parameter server",
    "backends": "run their roles on a backend of choice (threads, virtual clock, Ray)",
    "table_dims": "look up tables of several widths",
    "actor_roles": "run each worker's role inside its Ray worker actor (--ray.roles actors)",
    "dense_blocks": "cut their dense server into blocks across Ray actors (async's dense PS, "
                    "ShadowSync's sync PS or all-reduce, Persia's NN workers' all-reduce)",
}


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """One training algorithm.

    Attributes:
      name: its ``--algo`` value.
      kind: single (one device) | spmd (a device mesh, `recjax.train.loop` with a strategy) |
        host_async (roles on the engine of ``algorithms/runtime``).
      run: ``"module:function"``, the ``run(cfg) -> summary`` of the algorithm.
      sections: the config sections that are its own settings (switchable on ``--resume``).
      supports: the `CAPABILITIES` it has.
      summary: one line for the CLI's help.
    """

    name: str
    kind: str
    run: str
    sections: tuple[str, ...]
    supports: frozenset[str]
    summary: str


_ASYNC = frozenset({"lru_store", "backends", "in_loop_eval"})
_ENGINE = ("runtime", "ray")  # the host-async engine's sections

ALGORITHMS: tuple[Algorithm, ...] = (
    Algorithm("single", SINGLE, "recjax.train.loop:run", (),
              frozenset({"train_mode", "in_loop_eval", "table_dims"}),
              "one device, the reference trainer"),
    Algorithm("sync", SPMD, "algorithms.sync:run", ("spmd",),
              frozenset({"train_mode", "in_loop_eval"}),
              "synchronous SGD on a device mesh (data parallel, sharded tables)"),
    Algorithm("des", SPMD, "algorithms.des:run", ("spmd",), frozenset({"in_loop_eval"}),
              "DES: distributed equivalent substitution (Rong et al., SIGIR 2020)"),
    Algorithm("async", HOST_ASYNC, "algorithms.async_ps:run", _ENGINE,
              _ASYNC | {"actor_roles", "dense_blocks"},
              "asynchronous PS, Downpour / Hogwild (Dean et al. 2012)"),
    Algorithm("shadow", HOST_ASYNC, "algorithms.shadowsync:run", (*_ENGINE, "shadowsync"),
              _ASYNC | {"actor_roles", "dense_blocks"},
              "ShadowSync: background sync of replicas (Zheng et al. 2020)"),
    Algorithm("fr", HOST_ASYNC, "algorithms.shadowsync:run", (*_ENGINE, "shadowsync"),
              _ASYNC | {"actor_roles", "dense_blocks"},
              "ShadowSync's foreground baselines FR-EASGD / MA / BMUF"),
    Algorithm("gba", HOST_ASYNC, "algorithms.gba:run", (*_ENGINE, "gba"), _ASYNC | {"actor_roles"},
              "GBA: global-batch gradient aggregation and its baselines (Su et al., NeurIPS 2022)"),
    Algorithm("persia", HOST_ASYNC, "algorithms.persia:run", (*_ENGINE, "persia"),
              _ASYNC | {"actor_roles", "dense_blocks"},
              "Persia: hybrid sync dense / async embeddings (Lian et al., KDD 2022)"),
    Algorithm("diloco", SPMD, "algorithms.diloco:run", ("spmd", "diloco"),
              frozenset({"in_loop_eval"}),
              "DiLoCo / local SGD: replicas take H local steps, then a Nesterov outer step on "
              "their mean delta (Douillard et al. 2023)"),
)
REGISTRY: dict[str, Algorithm] = {a.name: a for a in ALGORITHMS}
NAMES: tuple[str, ...] = tuple(REGISTRY)


def names(kind: str | None = None, supports: str | None = None) -> tuple[str, ...]:
    """The algorithms of `kind` and/or with capability `supports`, in registry order."""
    return tuple(a.name for a in ALGORITHMS
                 if (kind is None or a.kind == kind) and (supports is None or supports in a.supports))


def handover_sections() -> tuple[str, ...]:
    """Every algorithm's own sections: a ``--resume`` may change them (a hand-over)."""
    return tuple(dict.fromkeys(s for a in ALGORITHMS for s in a.sections))


def help_line() -> str:
    """``--algo``'s help: each name with its summary."""
    return "training algorithm: " + "; ".join(f"{a.name}: {a.summary}" for a in ALGORITHMS)


def _either(xs: tuple[str, ...]) -> str:
    return xs[0] if len(xs) == 1 else ", ".join(xs[:-1]) + " or " + xs[-1]


@dataclasses.dataclass(frozen=True)
class Rule:
    """A setting only the algorithms with capability `needs` honour.

    Attributes:
      flag: the setting as the user writes it.
      needs: the capability (a key of `CAPABILITIES`).
      is_set: whether a config sets it.
      otherwise: what the refusal says to do (or why the others cannot).
    """

    flag: str
    needs: str
    is_set: Callable[[Any], bool]
    otherwise: str


RULES: tuple[Rule, ...] = (
    Rule("model.dropout / model.batch_norm", "train_mode",
         lambda c: bool(c.model.dropout or c.model.batch_norm),
         "would train without them: drop the flags"),
    Rule("train.early_stop_patience / train.keep_best", "in_loop_eval",
         lambda c: bool(c.train.early_stop_patience or c.train.keep_best),
         "evaluates at the end only: drop them"),
    Rule("--embed.store lru", "lru_store", lambda c: c.embed.store == "lru",
         "uses --embed.store fixed (hashed tables)"),
    Rule("--backend", "backends", lambda c: c.runtime.backend != "threads",
         "is SPMD or single (for several processes use scripts/launch.py): drop --backend"),
    Rule("--ray.roles actors", "actor_roles",
         lambda c: c.runtime.backend == "ray" and c.ray.roles == "actors",
         "runs its roles in the driver's threads under Ray (not ported yet): use --ray.roles "
         "driver (or auto)"),
    Rule("--ray.dense_shards", "dense_blocks",
         lambda c: c.runtime.backend == "ray" and c.ray.dense_shards > 1,
         "keeps its dense state in PS0 (Alg. 2's update is one event over the whole buffer): "
         "drop --ray.dense_shards"),
    Rule("embed.dims", "table_dims", lambda c: bool(c.embed.dims),
         "has sharded lookups that assume one width per group: drop embed.dims"),
)


def roles_in_actors(cfg) -> bool:
    """Whether a ``--backend ray`` run's worker roles run in their actors: ``--ray.roles
    actors``, or ``auto`` for an algorithm with the capability."""
    roles = cfg.ray.roles
    return roles == "actors" or (roles == "auto"
                                 and "actor_roles" in REGISTRY[cfg.train.algo].supports)


def check(cfg) -> None:
    """Refuse a setting the run's algorithm cannot honour, naming the ones that can.

    Raises:
      ValueError: the first rule of `RULES` the config breaks.
    """
    algo = REGISTRY[cfg.train.algo]
    for rule in RULES:
        if rule.is_set(cfg) and rule.needs not in algo.supports:
            able = names(supports=rule.needs)
            kinds = {REGISTRY[n].kind for n in able}
            whole = len(kinds) == 1 and set(able) == set(names(kind=next(iter(kinds))))
            which = _either(able) + (f" (the {next(iter(kinds)).replace('_', '-')} algorithms)"
                                     if whole and len(able) > 1 else "")
            raise ValueError(f"{rule.flag} runs with --algo {which}, which "
                             f"{CAPABILITIES[rule.needs]}; --algo {algo.name} {rule.otherwise}")
