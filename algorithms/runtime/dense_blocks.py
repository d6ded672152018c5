"""The dense parameters cut into blocks for a sharded dense PS (``--ray.dense_shards``).

Downpour SGD's parameter server "keeps the current state of all parameters for the model,
sharded across many machines" (Dean et al. 2012, Sec. 4.1): each shard applies the gradients of
its own parameters, independently of the others. Here a block is a set of whole leaves of the
params pytree (`blocks`: greedy by bytes), and a block's PS holds those leaves as ``{leaf index:
array}`` with the optimizer state cut the same way (`pick`). For an optimizer that acts on each
entry by itself (SGD, momentum, Adam, AdamW, Adagrad: every one of `make_dense_tx`'s without
global-norm clipping) a block's update is the one the whole tree's update makes for its leaves,
so the blocks together apply what one PS applies (tests/test_dense_blocks.py, to the bit).
`join` puts the blocks' params and optimizer states back into the single-process layout (the
checkpoint's, the eval's).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def blocks(params: Any, shards: int) -> list[list[int]]:
    """The leaf indices of each of `shards` blocks (leaves in ``jax.tree.leaves`` order), the
    largest leaf first onto the lightest block; no block empty.

    Raises:
      ValueError: more shards than leaves.
    """
    leaves = jax.tree.leaves(params)
    if not 1 <= shards <= len(leaves):
        raise ValueError(f"ray.dense_shards={shards}: the dense params have {len(leaves)} "
                         f"arrays, so 1 to {len(leaves)} blocks")
    load, out = [0] * shards, [[] for _ in range(shards)]
    for i in sorted(range(len(leaves)), key=lambda i: -int(np.size(leaves[i]))):
        s = min(range(shards), key=lambda s: (load[s], s))
        out[s].append(i)
        load[s] += int(np.size(leaves[i]))
    return [sorted(b) for b in out]


def _like_params(node: Any, pdef) -> bool:
    return jax.tree.structure(node) == pdef and pdef.num_leaves > 1


def pick(tree: Any, pdef, idx: list[int]) -> Any:
    """Block `idx` of `tree`: the params (a tree of structure `pdef`) as ``{leaf index: leaf}``,
    or an optimizer state with each of its params-shaped parts cut so (its other leaves, e.g.
    Adam's step count, as they are)."""
    if _like_params(tree, pdef):
        leaves = jax.tree.leaves(tree)
        return {i: leaves[i] for i in idx}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # optax's states: namedtuples
        return type(tree)(*(pick(x, pdef, idx) for x in tree))
    if isinstance(tree, (tuple, list)):
        return type(tree)(pick(x, pdef, idx) for x in tree)
    if isinstance(tree, dict):
        return {k: pick(v, pdef, idx) for k, v in tree.items()}
    return tree


def join(parts: list, like: Any, pdef) -> Any:
    """The blocks' `parts` (each as `pick` cut it) put back together in the layout of `like`
    (the whole params or optimizer state); a leaf that no block cut (a step count) is block
    0's."""
    if _like_params(like, pdef):
        leaves = [None] * pdef.num_leaves
        for part in parts:
            for i, v in part.items():
                leaves[i] = v
        return jax.tree.unflatten(pdef, leaves)
    if isinstance(like, tuple) and hasattr(like, "_fields"):
        return type(like)(*(join([p[k] for p in parts], x, pdef) for k, x in enumerate(like)))
    if isinstance(like, (tuple, list)):
        return type(like)(join([p[k] for p in parts], x, pdef) for k, x in enumerate(like))
    if isinstance(like, dict):
        return {k: join([p[k] for p in parts], v, pdef) for k, v in like.items()}
    return parts[0]
