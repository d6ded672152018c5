"""The algorithm registry (recjax/registry.py): every list of algorithms comes from it, and a
setting an algorithm cannot honour is refused, naming the ones that can.

The expected capabilities below are written by hand from the algorithms' docs (README's
feature table, DESIGN.md section 4), not read from the registry, so a wrong row fails here.
They cover the rows the registry began with (`ALL`, its first rows, in order); a row added
later checks its own capabilities, by hand, in its own test file (tests/test_diloco.py), so
adding an algorithm edits no list here.
"""

import dataclasses

import pytest

import algorithms
from algorithms.runtime.segments import HOST_ASYNC
from recjax import config_help, registry
from recjax.config import ALGOS, Config
from recjax.train import contract
from tests.runtime_util import small_cfg

ALL = ("single", "sync", "des", "async", "shadow", "fr", "gba", "persia")
ASYNC = ("async", "shadow", "fr", "gba", "persia")
# setting -> (config change, the algorithms that honour it)
HONOURED = {
    "dropout": (lambda c: _set(c, "model", dropout=0.1), ("single", "sync")),
    "batch_norm": (lambda c: _set(c, "model", batch_norm=True), ("single", "sync")),
    "early_stop": (lambda c: _set(c, "train", early_stop_patience=2, eval_every=4), ALL),
    "keep_best": (lambda c: _set(c, "train", keep_best=True, eval_every=4), ALL),
    "lru": (lambda c: _set(c, "embed", store="lru"), ASYNC),
    "ray": (lambda c: _set(c, "runtime", backend="ray"), ASYNC),
    "virtual": (lambda c: _set(c, "runtime", backend="virtual"), ASYNC),
    "dims": (lambda c: _set(c, "embed", dims="C1:4"), ("single",)),
    # every host-async algorithm's roles run in their Ray worker actors (ray_roles.py)
    "actor_roles": (lambda c: _set(_set(c, "runtime", backend="ray"), "ray", roles="actors"),
                    ASYNC),
    # a dense server cut into blocks across actors: async's dense PS, ShadowSync's sync PS or
    # all-reduce (--sync none, without one, refuses in shadowsync.run: below), Persia's NN
    # workers' all-reduce
    "dense_blocks": (lambda c: _set(_set(c, "runtime", backend="ray"), "ray", dense_shards=2),
                     ("async", "shadow", "fr", "persia")),
}


def _set(cfg, section, **kw):
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **kw)})


def test_every_list_of_algorithms_is_the_registry():
    assert registry.NAMES[:len(ALL)] == ALL
    assert ALGOS == config_help.CHOICES["train.algo"] == registry.NAMES
    assert registry.names(kind=registry.HOST_ASYNC) == HOST_ASYNC  # the engine's list
    assert HOST_ASYNC[:len(ASYNC)] == ASYNC
    assert set(algorithms.RUNNERS) == set(registry.NAMES)
    assert set(contract.HANDOVER_SECTIONS) == {s for a in registry.ALGORITHMS for s in a.sections}
    assert {"spmd", "runtime", "ray", "shadowsync", "gba", "persia"} <= set(
        contract.HANDOVER_SECTIONS)
    fields = {f.name for f in dataclasses.fields(Config)}
    assert all(s in fields for a in registry.ALGORITHMS for s in a.sections)


@pytest.mark.parametrize("name", registry.NAMES)
def test_each_row_runs_a_function(name):
    assert callable(algorithms.runner(name))


@pytest.mark.parametrize("setting", list(HONOURED))
@pytest.mark.parametrize("algo", ALL)
def test_a_setting_is_refused_by_the_algorithms_that_cannot_honour_it(algo, setting):
    change, able = HONOURED[setting]
    cfg = change(small_cfg(algo, steps=2))
    if algo in able:
        registry.check(cfg)
        return
    with pytest.raises(ValueError) as e:
        registry.check(cfg)
    msg = str(e.value)
    if setting in ("actor_roles", "dense_blocks") and algo not in HONOURED["ray"][1]:
        able = HONOURED["ray"][1]  # the first refusal: the Ray backend itself
    assert f"--algo {algo} " in msg and ("runs with --algo " + _either(able)) in msg, msg
    with pytest.raises(ValueError, match=f"--algo {algo} "):  # before anything is built
        algorithms.run(cfg)


def _either(xs):
    return xs[0] if len(xs) == 1 else ", ".join(xs[:-1]) + " or " + xs[-1]


def test_where_the_roles_run_under_ray():
    """``--ray.roles auto`` runs the roles in the actors for the algorithms ported there."""
    def where(algo, roles):
        cfg = small_cfg(algo)
        return registry.roles_in_actors(_set(cfg, "ray", roles=roles))

    for a in ("async", "gba", "shadow", "fr", "persia"):
        assert where(a, "auto") and where(a, "actors") and not where(a, "driver")
    assert set(registry.names(supports="actor_roles")) == set(ASYNC)
    for a in ("shadow", "fr"):  # every sync rule: MA / BMUF's groups hosted (ray_wire)
        for rule in ("easgd", "ma", "bmuf", "none"):
            cfg = _set(_set(small_cfg(a), "shadowsync", sync=rule), "ray", roles="auto")
            assert registry.roles_in_actors(cfg)
            registry.check(_set(_set(cfg, "ray", roles="actors"), "runtime", backend="ray"))


def test_help_names_every_algorithm():
    line = registry.help_line()
    assert all(f"{n}: " in line for n in registry.NAMES)
