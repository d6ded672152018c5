"""`sharding.spmd.abstract_batch`, the batch an SPMD algorithm traces its step on (sync's
communication counts, DES, DiLoCo), has the structure, shapes and dtypes of the batches the
data pipeline really delivers: with a mask exactly when they carry one (multi-hot fields, and a
behaviour sequence's one-hot position fields ``NAME@i``)."""

import dataclasses

import jax
import pytest

from recjax import configs
from recjax.data.pipeline import first_batches
from recjax.train.data import open_data
from sharding.spmd import abstract_batch


@pytest.mark.parametrize("train", [
    "synthetic",  # one-hot fields: no mask
    "synthetic-seq:n=2048,max_len=8",  # position fields: one-hot, with a mask
])
def test_the_abstract_batch_is_shaped_as_the_real_one(train):
    cfg = configs.smoke()
    if train != "synthetic":
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(
            cfg.data, train=train, eval=train + ",split=eval"))
    data = open_data(cfg)
    real = first_batches(data.train, 64, 1, seed=0, epoch=0, shuffle_buffer=0)[0]
    traced = abstract_batch(cfg, data.spec, 64)

    def shapes(b):
        return jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), b)

    assert jax.tree.structure(traced) == jax.tree.structure(real)
    assert shapes(traced) == shapes(real)
    assert (real.mask is not None) == (train != "synthetic")


@pytest.mark.parametrize("name, masked", [
    ("click@0", True), ("click@12", True), ("a@b@3", True),
    ("price@usd", False), ("@3", False), ("click@", False), ("click@3x", False), ("click@٣", False),
])
def test_only_position_names_make_a_spec_masked(name, masked):
    """A one-hot field carries a mask only as a sequence position ``NAME@i``; any other name
    with an ``@`` (a CSV column ``price@usd``) is an ordinary field, as the readers treat it."""
    from recjax.features import FeatureSpec, FieldSpec, position_of

    spec = FeatureSpec((), (FieldSpec("user", 10), FieldSpec(name, 10)))
    assert spec.masked is masked
    assert (position_of(name) is not None) is masked
