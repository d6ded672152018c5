"""Persia's roles (``persia.py`` tells the whole): module-level generator functions
``fn(rt, worker, *args)``, run by the run's placement where it runs them (this process's
threads or virtual clock, or each in its worker group's Ray actor: ``placement.run_role``).
They read the run through a `RoleContext` (values) and reach what they share through the
servers of ``persia_servers.py``; an embedding worker reaches the PS, and an NN worker computes,
through its own `worker` and functions (``placement.worker``, ``placement.role_fn``). A message
for another role (activations, their gradients) goes to the pipeline as ``worker.send`` makes
it and comes out through ``worker.receive``: the message itself in one process; under Ray in
the actors a reference, the bytes going from the sender's process to the receiver's once.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import jax.numpy as jnp
import numpy as np

from algorithms.persia_servers import FAILED
from algorithms.runtime import Collective, Link, Wait, Work
from algorithms.runtime.codec import Codec
from algorithms.runtime.ps import localize
from recjax.embeddings import lookup, row_gradients
from recjax.train.step import loss_and_grads, step_metrics


@dataclasses.dataclass(frozen=True)
class RoleContext:
    """What the roles read of the run, as values (sent to the roles' actors under Ray).

    Attributes:
      p: the run's `persia.Plan`.
      codec: the compression of ids and values (Sec. 4.2.3).
      layout: the model's table layout (an embedding worker localizes the ids it receives).
      start_step, total_steps: this interval's global steps.
      fail_nn_at: ``--persia.fail_nn_at`` (0: none).
      example_cost: modelled seconds per example of an NN worker's step.
      id_cost, ids_per_batch: modelled seconds per looked-up id, ids per global batch.
      allreduce_bytes, allreduce_seconds: one dense all-reduce's bytes per party, seconds.
      dense_bytes: the dense params' bytes.
      stragglers, emb_stragglers: the NN and the embedding workers' slowdowns.
      nn_link: the embedding <-> NN link (sent elsewhere: a new link of that name and
        bandwidth, whose bytes are counted where it is).
    """

    p: Any
    codec: Codec
    layout: Any
    start_step: int
    total_steps: int
    fail_nn_at: int
    example_cost: float
    id_cost: float
    ids_per_batch: int
    allreduce_bytes: int
    allreduce_seconds: float
    dense_bytes: int
    stragglers: Any
    emb_stragglers: Any
    nn_link: Link

    def __reduce__(self):
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        link = fields.pop("nn_link")
        return _remade, (fields, link.name, link.bandwidth)


def _remade(fields: dict, name: str, bandwidth: float) -> RoleContext:
    return RoleContext(**fields, nn_link=Link(name, bandwidth))


def slice_of(acts: dict, batch: Any, k: int, b: int) -> tuple:
    """NN worker `k`'s slice of a global batch: ``(activations, dense, labels)``, `b` rows."""
    part = slice(k * b, (k + 1) * b)
    return ({g: a[part] for g, a in acts.items()}, batch.dense[part], batch.label[part])


def embedding_forward(rt, worker, ctx: RoleContext, pipe, ledger, queue, look_up, e: int):
    """Alg. 1, forward task: take a batch (with a permit), look it up, send the slices."""
    p, codec = ctx.p, ctx.codec
    it = 0
    while True:
        while True:
            yield Wait(pipe.signal, functools.partial(pipe.may_look_up))
            if pipe.acquire():
                break
        item = worker.take()
        if item is None:
            pipe.release_unused()
            pipe.finish(e)
            return
        step, batch = item
        msg, raw, wire = codec.send_ids(batch.ids)
        ledger.add("loader->embedding", raw, wire)
        ids = codec.recv_ids(msg)
        local, rows = localize(ctx.layout, batch._replace(ids=ids))
        minis = worker.pull(rows)
        version = pipe.applied
        acts = look_up(minis, local.ids, local.mask)
        nbytes = worker.shard_bytes(rows)
        for s, b in enumerate(nbytes):
            ledger.add(f"ps{s}<->embedding", b)
        messages = []
        sent = 0
        for k in range(p.nn_workers):
            part = {}
            acts_k, dense, label = slice_of(acts, batch, k, p.local_batch)
            for g, a in acts_k.items():
                m, raw, wire = codec.send_values(np.asarray(a))
                ledger.add("embedding->nn", raw, wire)
                sent += wire
                part[g] = m
            messages.append(worker.send((part, dense, label)))
        transfers = tuple((link, b // 2) for link, b in zip(worker.links, nbytes) if b)
        yield Work(ctx.id_cost * ctx.ids_per_batch, ctx.emb_stragglers.factor(e, it),
                   transfers + ((ctx.nn_link, sent),))
        queue.append((step, local, rows, version))
        pipe.post_acts(step, e, messages)
        worker.counters.iterations += 1
        it += 1


def embedding_backward(rt, worker, ctx: RoleContext, pipe, queue, row_grads, e: int):
    """Alg. 1, backward task: gather the slices' gradients, put row gradients to the PS."""
    codec = ctx.codec
    it = 0
    while True:
        yield Wait(pipe.signal, functools.partial(pipe.queued_or_done, e))
        if not queue:
            return
        step, local, rows, version = queue[0]
        # updates apply in step order, so the staleness of Eq. 5 (updates applied between
        # a batch's lookup and its own update) is at most the tau batches outstanding at its
        # lookup; out of order, a slow backward role would see any number pass it
        yield Wait(pipe.signal, functools.partial(pipe.may_apply, step))
        queue.popleft()
        parts = [worker.receive(m) for m in pipe.take_grads(step, e)]
        g_acts = {g: jnp.concatenate([codec.recv_values(part[g]) for part in parts])
                  for g in parts[0]}
        row_g = row_grads(g_acts, local.ids, local.mask)
        nbytes = worker.shard_bytes(rows)
        transfers = tuple((link, b // 2) for link, b in zip(worker.links, nbytes) if b)
        yield Work(ctx.id_cost * ctx.ids_per_batch, ctx.emb_stragglers.factor(e, it), transfers)
        worker.push_rows(rows, row_g)
        pipe.applied_one(version)
        worker.counters.iterations += 1
        it += 1


def nn_worker(rt, worker, ctx: RoleContext, pipe, dense_ps, ledger, group, nn_grads, params):
    """Alg. 2 on slice k (`worker`'s id) of every global batch, in order: its gradient to the
    dense all-reduce (`group`, a ``clock.Collective``'s), or in async mode to `dense_ps`."""
    p, codec, k = ctx.p, ctx.codec, worker.wid
    version = 0
    for step in range(ctx.start_step, ctx.total_steps):
        yield Wait(pipe.signal, functools.partial(pipe.has_acts, step, k))
        msg, dense, label = worker.receive(pipe.take_acts(step, k))
        acts = {g: codec.recv_values(m) for g, m in msg.items()}
        if dense_ps is not None:
            params, version = dense_ps.pull()
        # a straggler's slowdown scales its forward/backward as timed where it ran
        # (`clock.Work.measured`), not the activations' round trip under Ray
        factor, secs = ctx.stragglers.factor(k, step), None
        if factor > 1:
            (m, g_params, g_acts), secs = nn_grads.timed(params, acts, dense, label)
        else:
            m, g_params, g_acts = nn_grads(params, acts, dense, label)
        worker.counters.metrics.append(m)
        worker.counters.indices.append(step)
        out, sent = {}, 0
        for g, a in g_acts.items():
            out[g], raw, wire = codec.send_values(np.asarray(a))
            ledger.add("nn->embedding", raw, wire)
            sent += wire
        yield Work(ctx.example_cost * p.local_batch, factor, ((ctx.nn_link, sent),),
                   measured=secs)
        pipe.post_grads(step, k, worker.send(out))
        if dense_ps is not None:
            ledger.add("nn<->dense-ps", 2 * ctx.dense_bytes)
            dense_ps.push(g_params, version)
        else:
            failed = k == 0 and step + 1 == ctx.fail_nn_at
            ledger.add("nn<->nn (all-reduce)", ctx.allreduce_bytes)
            t0 = time.perf_counter()
            params = yield Collective(group, k, FAILED if failed else g_params,
                                      ctx.allreduce_seconds)
            ledger.wait(time.perf_counter() - t0)
        worker.counters.iterations += 1


# -- the roles' jitted functions, built where they run (`placement.remote_fn` / `role_fn`) -----
def nn_grads_fn(rt, k: int):
    """An NN worker's forward/backward on its slice (Alg. 2), for `placement.remote_fn`: ``(params,
    acts, dense, label) -> (metrics, dense grads, activation grads)`` of one of `k` slices."""
    model, scale = rt.mini_model, np.float32(1.0 / k)

    def nn_grads(params, acts, dense, label):
        (loss, logits), (g_params, g_acts) = loss_and_grads(model, params, acts, _Batch(dense, label))
        # each slice's loss is its own mean: 1/K of it is its share of the global mean
        return (step_metrics(loss, logits, label), g_params,
                {g: a * scale for g, a in g_acts.items()})

    return nn_grads


def lookup_fn(rt):
    """An embedding worker's lookup: ``(mini tables, local ids, mask) -> activations``."""
    mini = rt.mini_layout
    return lambda minis, ids, mask: lookup(mini, minis, ids, mask)


def row_grads_fn(rt):
    """An embedding worker's backward: ``(activation grads, local ids, mask) -> row grads``."""
    mini = rt.mini_layout
    return lambda g_acts, ids, mask: row_gradients(mini, g_acts, ids, mask)


class _Batch:
    """The dense features and labels of a slice: all `loss_and_grads` reads of a batch."""

    def __init__(self, dense, label):
        self.dense, self.label = dense, label
