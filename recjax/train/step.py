"""The pure, jitted pieces every training algorithm composes (DESIGN.md section 1).

    acts               = lookup(tables, ids)                      sparse -> boundary
    loss, (g_p, g_a)   = value_and_grad(loss)(params, acts)       dense part + boundary gradient
    params, opt_state  = dense optimizer (optax) on g_p           replicated / data-parallel
    tables, slots      = sparse optimizer on the rows of g_a      model-parallel / PS

`train_step` is their single-device composition; algorithms (sync, DES, async PS, ShadowSync,
GBA, Persia) call the same functions in other arrangements instead of re-writing them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from recjax.batch import Batch
from recjax.embeddings import EmbeddingLayout, SparseOptimizer, lookup, row_gradients
from recjax.models import bce_loss
from recjax.models.ops import varying_axes


class TrainState(NamedTuple):
    """Everything that changes during training; a pytree.

    Attributes:
      step: i32[] updates applied so far.
      params: dense model parameters (flax ``params`` collection).
      opt_state: optax state of the dense optimizer.
      tables: ``name -> f32[V, Dg]`` embedding tables.
      slots: ``name -> sparse optimizer state`` beside each table's rows.
      batch_stats: the running averages of the model's batch norms (flax ``batch_stats``
        collection; ``model.batch_norm``); () without batch norm, so a state built by code
        that does not know this field (5 positional fields) is a model without it.
    """

    step: jax.Array
    params: Any
    opt_state: Any
    tables: dict
    slots: dict
    batch_stats: Any = ()


class DenseVars(NamedTuple):
    """Dense parameters with the batch-norm running averages: what a model with batch norm
    needs to predict. Pass it where ``params`` go (`Model.logits`, `predict`, a strategy's
    ``predict``); `eval_params` makes it from a state.

    Attributes:
      params: the flax ``params`` collection.
      batch_stats: the flax ``batch_stats`` collection.
    """

    params: Any
    batch_stats: Any


def eval_params(state: TrainState):
    """What `predict` takes as ``params`` for this state: the params, or `DenseVars` when the
    model has batch-norm running averages."""
    return DenseVars(state.params, state.batch_stats) if state.batch_stats else state.params


# Salt of the dropout keys, so they never coincide with the init key PRNGKey(seed).
_DROPOUT_SALT = 0x64726F70  # "drop"


def step_rng(seed: int, step: jax.Array) -> jax.Array:
    """The dropout key of global step ``step``: a pure function of (seed, step), so a resumed
    run draws the masks an uninterrupted one would (no key in the train state)."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), _DROPOUT_SALT), step)


class StepMetrics(NamedTuple):
    """Per-step sums for Train NE (ShadowSync Sec. 4: each batch is scored before the update).

    Attributes:
      loss: mean BCE of the batch (what was differentiated).
      logloss_sum: sum of per-example log loss.
      label_sum: number of clicks.
      prob_sum: sum of predicted probabilities (for calibration).
      count: examples.
    """

    loss: jax.Array
    logloss_sum: jax.Array
    label_sum: jax.Array
    prob_sum: jax.Array
    count: jax.Array


@dataclasses.dataclass(frozen=True)
class Model:
    """A dense flax module bound to its embedding layout: what the step functions need.

    Attributes:
      module: flax module, ``module.apply({"params": p}, acts, dense) -> logits f32[B]``.
      layout: which tables feed which activation groups.
      microbatches: run the dense forward/backward as a loop over this many slices of the
        batch (see `loss_and_grads`); 1 = the whole batch at once; 0 = auto
        (`resolve_microbatches`).
      seed: seed of the dropout keys (`step_rng`; ``train.seed``).
    """

    module: Any
    layout: EmbeddingLayout
    microbatches: int = 0
    seed: int = 0

    @property
    def batch_norm(self) -> bool:
        """The module keeps batch-norm statistics (a mutable ``batch_stats`` collection)."""
        return bool(getattr(self.module, "batch_norm", False))

    @property
    def dropout(self) -> bool:
        return getattr(self.module, "dropout", 0.0) > 0

    @property
    def train_mode(self) -> bool:
        """Training differs from eval (dropout or batch norm): steps must use
        `loss_and_grads_train`."""
        return self.batch_norm or self.dropout

    def logits(self, params, acts: dict, dense: jax.Array) -> jax.Array:
        """Eval-mode logits: no dropout, batch norms on their running averages (``params`` is
        then a `DenseVars`)."""
        if isinstance(params, DenseVars):
            return self.module.apply({"params": params.params, "batch_stats": params.batch_stats},
                                     acts, dense)
        return self.module.apply({"params": params}, acts, dense)

    def train_logits(self, params, batch_stats, acts: dict, dense: jax.Array, rng: jax.Array):
        """Training-mode logits and the updated batch-norm averages: dropout masks drawn from
        ``rng``, batch norms on the batch's statistics."""
        variables = {"params": params}
        kw = {"rngs": {"dropout": rng}} if self.dropout else {}
        if not self.batch_norm:
            return self.module.apply(variables, acts, dense, train=True, **kw), batch_stats
        variables["batch_stats"] = batch_stats
        logits, new = self.module.apply(variables, acts, dense, train=True,
                                        mutable=["batch_stats"], **kw)
        return logits, new["batch_stats"]


def per_example_logloss(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """-(y log p + (1-y) log(1-p)) with p = sigmoid(logit), in the stable softplus form."""
    return jax.nn.softplus(logits) - labels * logits


SLICE_ROWS = 512  # rows per slice of the auto setting: a slice's MLP activations fit in cache


def resolve_microbatches(m: int, b: int, backend: str | None = None) -> int:
    """The slices a batch of ``b`` rows is cut into for ``microbatches = m``.

    ``m > 0`` is taken as given. ``m = 0`` (auto) is one pass off the CPU, where slicing costs
    up to 2.6x (docs/performance.md, GPU section), and on XLA:CPU the most slices of at least
    `SLICE_ROWS` rows that divide ``b`` (1.3-1.4x for DLRM at B=4096 there): 8 at 4096, 2 at
    1024, 1 below 1024.
    """
    if m:
        return m
    if (backend or jax.default_backend()) != "cpu":
        return 1
    m = max(b // SLICE_ROWS, 1)
    while b % m:
        m -= 1
    return m


def loss_and_grads(model: Model, params, acts: dict, batch: Batch):
    """Loss, logits and gradients w.r.t. the dense params and the activations.

    For a model whose training differs from its eval (``model.train_mode``: dropout, batch
    norm) use `loss_and_grads_train`; this one refuses such a model rather than silently train
    it in eval mode.

    With m = ``resolve_microbatches(model.microbatches, b)`` > 1, the batch is cut into m equal
    slices and a `lax.fori_loop` accumulates ``grad(mean_slice / m)``: the same gradient as one pass
    over the batch (only the float summation order differs), but each slice's MLP activations
    stay in cache. On the 2-core CPU this is ~1.3-1.4x faster for DLRM at B=4096
    (docs/performance.md).

    Inside `jax.shard_map`, autodiff sums a replicated parameter's gradient over the mesh axes
    the loss varies over (the transpose of the implicit ``pcast`` to varying). Taken per slice,
    that would be m all-reduces of the dense gradient per step; here the parameters are cast to
    varying once, the slices' local gradients are summed, and one `psum` per parameter over
    exactly those axes follows: the same gradient, one all-reduce.

    Returns:
      ((loss, logits), (g_params, g_acts)); ``g_acts`` has the shapes of ``acts``.
    """
    if getattr(model, "train_mode", False):
        raise ValueError("this model has dropout or batch norm (model.dropout / model.batch_norm); "
                         "its training step must call loss_and_grads_train (the algorithms that "
                         "do: --algo single, sync)")
    return _loss_and_grads(model, params, acts, batch, None, None)[:2]


def loss_and_grads_train(model: Model, params, batch_stats, acts: dict, batch: Batch,
                         rng: jax.Array):
    """`loss_and_grads` in training mode: dropout masks from ``rng`` (slice i of a microbatched
    step from ``fold_in(rng, i)``), batch norms on the batch statistics.

    Batch norm needs the whole batch in one pass (its statistics are the batch's), so a model
    with batch norm runs unsliced under ``train.microbatches=0`` and refuses an explicit m > 1.

    Returns:
      ``((loss, logits), (g_params, g_acts), new_batch_stats)``.
    """
    return _loss_and_grads(model, params, acts, batch, batch_stats, rng)


def _loss_and_grads(model, params, acts, batch, batch_stats, rng):
    train = rng is not None
    b = batch.label.shape[0]
    if train and model.batch_norm:
        if model.microbatches > 1:
            raise ValueError(f"model.batch_norm needs the whole batch in one pass; "
                             f"train.microbatches={model.microbatches} would normalise each "
                             "slice alone. Set train.microbatches=0 (auto) or 1")
        m = 1
    else:
        m = resolve_microbatches(model.microbatches, b)

    def loss_fn(p, a, dense, label, key=None):
        if train:
            logits, stats = model.train_logits(p, batch_stats, a, dense, key)
            return bce_loss(logits, label) / m, (logits, stats)
        logits = model.logits(p, a, dense)
        return bce_loss(logits, label) / m, logits

    grad_fn = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)
    if m == 1:
        if train:
            (loss, (logits, stats)), grads = grad_fn(params, acts, batch.dense, batch.label, rng)
            return (loss, logits), grads, stats
        return grad_fn(params, acts, batch.dense, batch.label)
    if train:  # dropout only (batch norm runs unsliced): slice i draws from fold_in(rng, i)
        plain = loss_fn
        loss_fn = lambda p, a, dense, label, i=0: (  # noqa: E731
            lambda out: (out[0], out[1][0]))(plain(p, a, dense, label, jax.random.fold_in(rng, i)))
        grad_fn = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)

    if b % m:
        raise ValueError(f"batch of {b} does not split into train.microbatches={m} equal slices")
    split = lambda x: x.reshape((m, b // m) + x.shape[1:])
    unsplit = lambda x: x.reshape((b,) + x.shape[2:])

    acts_s, dense_s, label_s = jax.tree.map(split, acts), split(batch.dense), split(batch.label)
    take = lambda tree, i: jax.tree.map(  # noqa: E731
        lambda x: jax.lax.dynamic_index_in_dim(x, i, keepdims=False), tree)
    put = lambda tree, new, i: jax.tree.map(  # noqa: E731
        lambda x, v: jax.lax.dynamic_update_index_in_dim(x, v.astype(x.dtype), i, 0), tree, new)
    params, sum_over = _defer_psum(
        lambda p: loss_fn(p, take(acts_s, 0), dense_s[0], label_s[0])[0], params)
    # The first slice is peeled off the loop so the carry starts as a real gradient: inside
    # shard_map a zeros carry would be typed as unvarying over the mesh axes, the gradients as
    # varying, and the loop requires one type for both.
    (loss, logits0), (g_params, g_acts0) = grad_fn(params, take(acts_s, 0), dense_s[0], label_s[0])
    # Slice i's activation gradient overwrites slice i's activations, which no later slice
    # reads: a scan's stacked output would be a fresh, zero-filled [m, b/m, ...] buffer plus a
    # concatenation with the peeled slice (~2 ms a step for DLRM at B=4096 on the 2-core CPU).
    grads = put(acts_s, g_acts0, 0)
    logits = jax.lax.dynamic_update_index_in_dim(
        jnp.zeros((m, b // m), logits0.dtype), logits0, 0, 0)

    def body(i, carry):
        loss, g_params, grads, logits = carry
        (part, lg), (gp, ga) = grad_fn(params, take(grads, i), dense_s[i], label_s[i],
                                       *((i,) if train else ()))
        return (loss + part, jax.tree.map(jnp.add, g_params, gp), put(grads, ga, i),
                jax.lax.dynamic_update_index_in_dim(logits, lg.astype(logits.dtype), i, 0))

    loss, g_params, grads, logits = jax.lax.fori_loop(1, m, body, (loss, g_params, grads, logits))
    g_params = jax.tree.map(lambda g, ax: jax.lax.psum(g, ax) if ax else g, g_params, sum_over)
    return (loss, unsplit(logits)), (g_params, jax.tree.map(unsplit, grads)), batch_stats


def _defer_psum(loss_of_params, params):
    """``(params', axes)``: each leaf cast to vary over the axes the loss varies over and it does
    not, and those axes (a tuple per leaf; () outside shard_map). The gradient w.r.t. params'
    summed with ``psum(g, axes)`` is the gradient w.r.t. params."""
    loss_axes = varying_axes(jax.eval_shape(loss_of_params, params))
    axes = jax.tree.map(lambda p: tuple(sorted(loss_axes - varying_axes(p))), params)
    cast = lambda p, ax: jax.lax.pcast(p, ax, to="varying") if ax else p  # noqa: E731
    return jax.tree.map(cast, params, axes), axes


def apply_dense(tx: optax.GradientTransformation, params, opt_state, g_params):
    updates, opt_state = tx.update(g_params, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def apply_sparse(model: Model, opt: SparseOptimizer, tables: dict, slots: dict, batch: Batch,
                 g_acts: dict, step: jax.Array) -> tuple[dict, dict]:
    """Apply the activation gradients to the touched rows of every table."""
    rows = row_gradients(model.layout, g_acts, batch.ids, batch.mask)
    new_tables, new_slots = {}, {}
    for name, (ids, grads) in rows.items():
        new_tables[name], new_slots[name] = opt.update(tables[name], slots[name], ids, grads, step)
    return new_tables, new_slots


def step_metrics(loss: jax.Array, logits: jax.Array, labels: jax.Array) -> StepMetrics:
    return StepMetrics(loss=loss,
                       logloss_sum=per_example_logloss(logits, labels).sum(),
                       label_sum=labels.sum(),
                       prob_sum=jax.nn.sigmoid(logits).sum(),
                       count=jnp.asarray(labels.shape[0], jnp.float32))


def train_step(model: Model, tx: optax.GradientTransformation, opt: SparseOptimizer,
               state: TrainState, batch: Batch) -> tuple[TrainState, StepMetrics]:
    """One synchronous step on one device: the reference every distributed form must match."""
    acts = lookup(model.layout, state.tables, batch.ids, batch.mask)
    if model.train_mode:
        (loss, logits), (g_params, g_acts), stats = loss_and_grads_train(
            model, state.params, state.batch_stats, acts, batch, step_rng(model.seed, state.step))
    else:
        (loss, logits), (g_params, g_acts) = loss_and_grads(model, state.params, acts, batch)
        stats = state.batch_stats
    params, opt_state = apply_dense(tx, state.params, state.opt_state, g_params)
    tables, slots = apply_sparse(model, opt, state.tables, state.slots, batch, g_acts, state.step)
    new = TrainState(state.step + 1, params, opt_state, tables, slots, stats)
    return new, step_metrics(loss, logits, batch.label)


def predict(model: Model, params, tables: dict, batch: Batch) -> jax.Array:
    """Logits of a batch (eval); ``params`` as `eval_params` gives them."""
    acts = lookup(model.layout, tables, batch.ids, batch.mask)
    return model.logits(params, acts, batch.dense)


def jit_train_step(model: Model, tx, opt):
    """`train_step` jitted with the state donated, so tables are updated in place."""
    return jax.jit(lambda s, b: train_step(model, tx, opt, s, b), donate_argnums=0)


def jit_predict(model: Model):
    return jax.jit(lambda p, t, b: predict(model, p, t, b))
