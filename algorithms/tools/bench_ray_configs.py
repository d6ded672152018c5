"""The configs the Ray benchmark runs (``scripts/bench_ray.py``, `bench_ray`): async PS with W
workers on synthetic data (`bench_config`), GBA's and Persia's forms of it for the serial
measurement, and each host-async algorithm's 2-worker form (`algo_config`)."""

from __future__ import annotations

import dataclasses

from recjax import configs
from recjax.data.synthetic import PRESETS


def bench_config(backend: str, workers: int, steps: int, batch: int, stragglers: str = "none",
                 model: str = "dlrm_kaggle", seed: int = 0, roles: str = "auto"):
    """Async PS, `workers` workers, on synthetic data (enough for `steps` steps); under Ray
    the workers' roles where `roles` says (``--ray.roles``)."""
    c = configs.CONFIGS[model]()
    preset = "criteo" if model == "dlrm_kaggle" else "default"
    return dataclasses.replace(
        c, synthetic=dataclasses.replace(PRESETS[preset], n_train=(steps + 8) * batch,
                                         n_eval=2048),
        data=dataclasses.replace(c.data, shuffle_buffer=0, prefetch=4),
        train=dataclasses.replace(c.train, algo="async", batch_size=batch, steps=steps,
                                  seed=seed, progress=False, deterministic=False,
                                  eval_batch_size=2048),
        runtime=dataclasses.replace(c.runtime, trainers=workers, workers_per_trainer=1,
                                    stragglers=stragglers, backend=backend),
        ray=dataclasses.replace(c.ray, snapshot_every=1_000_000, roles=roles))


def gba_serial_config(backend: str, workers: int, steps: int, batch: int,
                      stragglers: str = "none", model: str = "dlrm_kaggle", seed: int = 0,
                      roles: str = "auto"):
    """`bench_config` as GBA's own mode runs it (``--serial --serial-algo gba``): `workers`
    workers of `batch` rows, M = N = `workers` (a global step is one entry per worker), `steps`
    worker steps (data-list entries) in all."""
    c = bench_config(backend, workers, steps, batch, stragglers, model, seed, roles)
    return dataclasses.replace(
        c, train=dataclasses.replace(c.train, algo="gba", steps=steps // workers,
                                     batch_size=batch * workers),
        gba=dataclasses.replace(c.gba, mode="gba", workers=workers, local_batch_size=batch))


def persia_serial_config(backend: str, workers: int, steps: int, batch: int,
                         stragglers: str = "none", model: str = "dlrm_kaggle", seed: int = 0,
                         roles: str = "auto"):
    """`bench_config` as Persia's hybrid mode runs it (``--serial --serial-algo persia``):
    `workers` NN workers of `batch` rows (the global batch `workers` x `batch`), half as many
    embedding workers (at least one), tau = 4, `steps` NN worker steps in all; the
    stragglers slow the NN workers' forward/backward."""
    c = bench_config(backend, workers, steps, batch, stragglers, model, seed, roles)
    return dataclasses.replace(
        c, train=dataclasses.replace(c.train, algo="persia", steps=steps // workers,
                                     batch_size=batch * workers),
        persia=dataclasses.replace(c.persia, mode="hybrid", nn_workers=workers,
                                   embedding_workers=max(1, workers // 2), staleness=4))


def algo_config(algo: str, backend: str, steps: int, batch: int, seed: int = 0,
                roles: str = "auto"):
    """`bench_config` with 2 workers of `batch` rows each, as `algo` runs them (measurement 5);
    ``shadow:RULE`` / ``fr:RULE``: ShadowSync with ``--sync RULE`` (default: the config's).

    GBA and Persia count a step as one global batch of both workers' rows (2 x `batch`)."""
    algo, _, rule = algo.partition(":")
    k = 2 if algo in ("gba", "persia") else 1  # worker batches per step
    c = bench_config(backend, 2, steps * k, batch, seed=seed, roles=roles)
    c = dataclasses.replace(c, train=dataclasses.replace(
        c.train, algo=algo, steps=steps, batch_size=batch * k))
    if algo == "gba":
        c = dataclasses.replace(c, gba=dataclasses.replace(c.gba, mode="gba", workers=2,
                                                           local_batch_size=batch))
    if algo == "persia":
        c = dataclasses.replace(c, persia=dataclasses.replace(
            c.persia, mode="hybrid", nn_workers=2, embedding_workers=2))
    if rule:
        c = dataclasses.replace(c, shadowsync=dataclasses.replace(c.shadowsync, sync=rule))
    return c


def with_chunk_s(config, chunk_s: float, *args, **kw):
    """``config(*args, **kw)`` with ``--ray.chunk_s`` `chunk_s` (``bench_ray --serial
    --chunk-s``: how the driver's CPU per step follows the chunk's length)."""
    c = config(*args, **kw)
    return dataclasses.replace(c, ray=dataclasses.replace(c.ray, chunk_s=chunk_s))
