"""The dense params cut into blocks for a sharded dense PS (algorithms/runtime/dense_blocks.py):
each block's PS, applying the run's optimizer to its own leaves, makes the update one PS makes
for the whole tree, for every dense optimizer recjax has; and the blocks join back into the
single-process layout. To the bit for SGD, momentum and Adagrad; Adam's and AdamW's differ in
the last bit of some entries (XLA fuses each block's program on its own: 1.5e-6 relative, seen),
so those compare to 1e-5."""

import jax
import numpy as np
import pytest

from algorithms.runtime import dense_blocks as db
from recjax.config import DenseOptimConfig
from recjax.train.setup import make_dense_tx
from recjax.train.step import apply_dense


def _params(seed=0):
    r = np.random.default_rng(seed)
    return {"bottom": {"w": r.normal(size=(13, 8)).astype(np.float32),
                       "b": r.normal(size=(8,)).astype(np.float32)},
            "top": {"w": r.normal(size=(40, 1)).astype(np.float32),
                    "b": r.normal(size=(1,)).astype(np.float32)},
            "x": r.normal(size=(5, 5)).astype(np.float32)}


def test_blocks_cover_every_leaf_once_balanced_by_size():
    p = _params()
    sizes = [int(np.size(x)) for x in jax.tree.leaves(p)]  # b 8, w 104, b 1, w 40, x 25
    got = db.blocks(p, 2)
    assert sorted(i for b in got for i in b) == list(range(len(sizes)))
    # by hand: 104 -> block 0; 40 -> 1; 25 -> 1 (65); 8 -> 1 (73); 1 -> 1 (74)
    assert got == [[1], [0, 2, 3, 4]]
    assert db.blocks(p, 1) == [[0, 1, 2, 3, 4]]
    with pytest.raises(ValueError, match="dense_shards=6"):
        db.blocks(p, 6)


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "adamw", "adagrad"])
def test_blocks_apply_what_one_ps_applies(name):
    """Three pushes of different gradients: the blocks' params and optimizer states, joined,
    equal one PS's."""
    tx = make_dense_tx(DenseOptimConfig(name=name, lr=0.05))
    apply = jax.jit(lambda p, o, g: apply_dense(tx, p, o, g))
    p = _params()
    pdef = jax.tree.structure(p)
    o = tx.init(p)
    cut = db.blocks(p, 3)
    parts = [(db.pick(p, pdef, b), db.pick(o, pdef, b)) for b in cut]
    for k in range(3):
        g = _params(seed=10 + k)
        p, o = apply(p, o, g)
        parts = [apply(bp, bo, db.pick(g, pdef, b)) for (bp, bo), b in zip(parts, cut)]
    got_p = db.join([bp for bp, _ in parts], p, pdef)
    got_o = db.join([bo for _, bo in parts], o, pdef)
    tol = 1e-5 if name.startswith("adam") else 0.0

    def same(a, b):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol * 1e-2)

    jax.tree.map(same, got_p, p)
    assert jax.tree.structure(got_o) == jax.tree.structure(o)
    jax.tree.map(same, got_o, o)
