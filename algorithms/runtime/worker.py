"""What one worker computes and counts, the same in the driver's threads and in a Ray worker
group's actor (``ray_workers.py`` builds these from the config without the engine):

* `model_spec`, `mini_layout`, `make_grads`: the model a run's workers train and their gradient
  on the rows a batch pulled (mini tables), unjitted;
* `Counters`, `record_step`: a role's counters and one step's record and `clock.Work`;
* `Worker`, `LocalFn`, `Replica`: the in-process worker, jitted function and dense replica the
  threads share (``Runtime.worker`` / ``remote_fn`` give the Ray versions under ``ray``).
"""

from __future__ import annotations

import dataclasses
import time
import types
from typing import Any

import jax
import jax.numpy as jnp

from algorithms.runtime import batched
from algorithms.runtime.clock import Work
from algorithms.runtime.supply import SharedList, StaticShards
from recjax.config import Config
from recjax.embeddings import lookup, row_gradients
from recjax.features import FeatureSpec
from recjax.train.step import Model, loss_and_grads, step_metrics

Runtime = Any  # `engine.Runtime` (not imported: the engine imports this module)


def with_vocab(spec: FeatureSpec, vocab: int) -> FeatureSpec:
    """`spec` with every field's vocabulary set to `vocab` (raw-id data: the store's rows)."""
    return dataclasses.replace(spec, fields=tuple(dataclasses.replace(f, vocab_size=vocab)
                                                  for f in spec.fields))


def model_spec(cfg: Config, spec: FeatureSpec) -> FeatureSpec:
    """The feature spec the run's model is built on (raw-id data: the LRU store's rows)."""
    return with_vocab(spec, cfg.embed.capacity) if cfg.embed.store == "lru" else spec


def mini_layout(layout, rows: int, max_len: int):
    """The layout of per-batch mini tables: every touched row of a `rows`-row batch."""
    return dataclasses.replace(layout, tables=tuple(
        dataclasses.replace(t, num_embeddings=rows * len(t.field_index) * max_len)
        for t in layout.tables))


def make_grads(mini, mini_model: Model):
    """A worker's gradient on the rows it pulled, unjitted: ``grads(params, minis, local) ->
    (metrics, g_params, {table: (local ids, row grads)})`` and ``grads_rows``, the same with
    one summed row per unique id (``table -> f32[n_pad, D]``, GBA's PS aggregates those).

    Module-level so that a worker process (the Ray backend) builds the same function from the
    config as the threads do."""

    def grads(params, minis, batch):
        acts = lookup(mini, minis, batch.ids, batch.mask)
        (loss, logits), (g_params, g_acts) = loss_and_grads(mini_model, params, acts, batch)
        rows = row_gradients(mini, g_acts, batch.ids, batch.mask)
        return step_metrics(loss, logits, batch.label), g_params, rows

    def grads_rows(params, minis, batch):
        m, g_params, rows = grads(params, minis, batch)
        summed = {k: jnp.zeros_like(minis[k]).at[ids].add(g, mode="drop")
                  for k, (ids, g) in rows.items()}
        return m, g_params, summed

    return grads, grads_rows


class Replica:
    """A trainer's dense params and optimizer state, shared by its threads without a lock.

    Each update is a read-modify-write of the attribute (one jitted call in between), so a
    concurrent update can be lost: Hogwild's race, at the granularity of the pytree.
    """

    def __init__(self, params: Any, opt_state: Any):
        self.params, self.opt_state = params, opt_state

    def apply(self, dense_apply, grads: Any) -> None:
        self.params, self.opt_state = dense_apply(self.params, self.opt_state,
                                                  batched.resolve(grads))


@dataclasses.dataclass
class Counters:
    """A role's counters (owned by one role: no locks). Attributes:
      iterations: training iterations done.
      metrics: per-iteration `StepMetrics` (each batch scored before its update).
      indices: the supply's index of each iteration's batch (GBA: its data-list entry).
      shard_bytes: embedding bytes served per PS shard.
      syncs: syncs performed.
      sync_bytes: bytes moved by syncs.
    """

    iterations: int = 0
    metrics: list = dataclasses.field(default_factory=list)
    indices: list = dataclasses.field(default_factory=list)
    shard_bytes: list = dataclasses.field(default_factory=list)
    syncs: int = 0
    sync_bytes: int = 0


class Worker:
    """One worker: batches from its supply, one iteration's pull/compute/push, its counters."""

    def __init__(self, rt: Runtime, wid: int, supply: StaticShards | SharedList):
        self.rt, self.wid, self.supply = rt, wid, supply
        self.counters = Counters(shard_bytes=[0] * rt.ps.num_shards)

    def take(self) -> tuple[int, Any] | None:
        """The next ``(index, (localized batch, rows))`` from the supply, or None."""
        return self.supply.take(self.wid)

    def compute(self, params: Any, item: tuple, it: int, coalesce: bool = False
                ) -> tuple[Any, tuple, Work]:
        """Pull rows, compute gradients at `params`: ``(g_params, pending push, Work)``.

        With `coalesce` the row gradients are one summed row per unique id of the batch
        (``name -> f32[n_pad, D]``, in the order of ``rows``), which GBA's PS aggregates. On
        the virtual clock (a run of several workers) the gradients are `batched.Part`\\ s,
        computed with the other workers' pending calls when first used: a role passes them
        to `push`, `Replica.apply` or a PS, or reads them with `batched.resolve`.
        """
        rt = self.rt
        _, (local, rows) = item
        minis = rt.ps.pull(rows)
        fn = rt.grads_rows if coalesce else rt.grads
        factor = rt.stragglers.factor(self.wid, it)
        batcher = batched.active()
        if batcher is not None and rt.num_workers > 1:
            metrics, at = self.counters.metrics, len(self.counters.metrics)
            d = batcher.submit(fn, rt.num_workers, (params, minis, local),
                               on_done=lambda out: metrics.__setitem__(at, out[0]))
            return d.part(1), (rows, d.part(2)), record_step(rt, self.wid, self.counters, item,
                                                             None, it, factor=factor)
        t0 = time.perf_counter()
        m, g_params, grads = fn(params, minis, local)
        measured = None
        if factor > 1:
            jax.block_until_ready((m, g_params, grads))
            measured = time.perf_counter() - t0
        return g_params, (rows, grads), record_step(rt, self.wid, self.counters, item, m, it,
                                                    measured, factor)

    def push(self, pending: tuple) -> None:
        rows, grads = pending
        self.rt.ps.push(rows, batched.resolve(grads))
        self.counters.iterations += 1

    # -- the embedding PS, reached by the role itself (Persia's embedding workers) ----------
    @staticmethod
    def send(message):
        """A message to another role (Persia's activations) as a server holds it for that role:
        here, the message itself (`ray_role_worker.RoleWorker.send`: a reference)."""
        return message

    receive = send

    @property
    def links(self) -> list:
        """The PS shards' links (`clock.Link`), in shard order."""
        return self.rt.shard_links

    def pull(self, rows) -> dict:
        """The mini tables of `rows` (`ps.EmbeddingPS.pull`)."""
        return self.rt.ps.pull(rows)

    def push_rows(self, rows, grads: dict) -> None:
        """``grads[name] = (local ids, row grads)`` to the PS (`ps.EmbeddingPS.push`)."""
        self.rt.ps.push(rows, grads)

    def shard_bytes(self, rows) -> list[int]:
        """Bytes each PS shard serves for `rows`."""
        return self.rt.ps.shard_bytes(rows)


def companion_here(counters, worker=None) -> Any:
    """`placement.Placement.companion` where the role runs in this process: `worker` (the role
    reaches the PS through it), or an object with `counters` only."""
    return worker if worker is not None else types.SimpleNamespace(counters=counters)


class LocalFn:
    """A jitted function run in this process (`Runtime.remote_fn` on threads), called as
    `ray_workers.RemoteFn` is: ``fn(*args)``, or ``fn.timed(*args) -> (out, seconds)``, which
    blocks on the result to time it (a straggler's measured compute, `clock.Work.measured`;
    a plain call keeps jax's async dispatch)."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args):
        return self.fn(*args)

    def timed(self, *args) -> tuple[Any, float]:
        t0 = time.perf_counter()
        out = jax.block_until_ready(self.fn(*args))
        return out, time.perf_counter() - t0


def record_step(rt: Runtime, wid: int, counters: Counters, item: tuple, m: Any, it: int,
                measured: float | None = None, factor: float | None = None) -> Work:
    """Count worker `wid`'s step on `item` (its metrics `m`, the bytes each shard served) and
    return the step's `Work`: its compute time, straggling (`factor`, if the caller drew it
    already) and PS-link transfers."""
    counters.metrics.append(m)
    counters.indices.append(item[0])
    rows = item[1][1]
    nbytes = rt.ps.shard_bytes(rows)
    for s, b in enumerate(nbytes):
        counters.shard_bytes[s] += b
    if factor is None:
        factor = rt.stragglers.factor(wid, it)
    return Work(rt.example_cost * rt.batch_size, factor,
                tuple((link, b) for link, b in zip(rt.shard_links, nbytes) if b),
                measured=measured)
