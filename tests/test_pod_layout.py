"""The pieces of a multi-process checkpoint, in one process on 8 fake CPU devices (conftest.py):

* `recjax.checksum.wsum32` equals its numpy definition, is the same for an array split over
  8 devices as for the array whole, and changes with any flipped bit or swapped words;
* the checkpoint `layout` rule, case by case;
* `CheckpointLayout`: a sync or DES state trained two steps on its mesh, written in the
  single-device layout on the devices (`logical`), equals the host path (`unshard`) bit for
  bit, and placed back (`place_restored`) equals the state it came from bit for bit, for
  every sharding type and both meshes (DiLoCo's: tests/test_pod_runs.py, a bitwise resume);
* a `ShardedCheckpointer` step written from arrays split over 8 devices reads back whole
  with the single-process `Checkpointer` (what ``--algo gba`` and a 1-device resume do), and
  split over another mesh with `ShardedCheckpointer`; an edited checksum is caught;
* a save of row-wise tables moves no rows (`padded_rows`: no collective in its program);
* a step whose array files were damaged after the commit is caught on restore and the step
  before is read; the commit check (metadata only) catches a step without all its arrays.

The multi-process runs themselves: tests/test_pod_runs.py.
"""

import json

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from algorithms.des import DesSetup, DesStrategy
from algorithms.sync import SyncSetup, SyncStrategy
from recjax.checkpoint import CheckpointCorruptError, Checkpointer
from recjax.checkpoint_sharded import (
    ShardedCheckpointer,
    array_names,
    layout,
    padded_rows,
    shardings,
)
from recjax.checksum import wsum32, wsum32_numpy
from sharding.mesh import make_mesh
from tests.test_sharding_helpers import ONE_HOT, build_spec, random_batch, tiny_cfg


def test_wsum32_is_its_definition_and_ignores_the_layout():
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(40, 6)).astype(np.float32), rng.integers(-9, 9, (8, 3, 2), np.int32),
          np.array(7, np.int32), rng.normal(size=(16,)).astype(np.float16),
          np.array([True, False, True])]
    # the definition by hand for a tiny one: words 1, 2, 3 at positions 0, 1, 2 -> 1 + 6 + 15
    assert wsum32([np.array([1, 2, 3], np.int32)]) == [f"{22:08x}"]
    assert wsum32(xs) == [wsum32_numpy(x) for x in xs]
    mesh = make_mesh({"data": 4, "model": 2})
    split = [jax.device_put(xs[0], NamedSharding(mesh, P("data", "model"))),
             jax.device_put(xs[1], NamedSharding(mesh, P(("data", "model"))))]
    assert wsum32(split) == wsum32(xs[:2])
    flipped = xs[0].copy()
    flipped.view(np.uint32)[17, 3] ^= 1 << 31  # the top bit: w * 2^31 is odd * 2^31, not 0
    swapped = xs[0].copy()
    swapped[[2, 5]] = swapped[[5, 2]]
    assert wsum32_numpy(flipped) != wsum32_numpy(xs[0]) != wsum32_numpy(swapped)


def test_layout_rule():
    mesh = make_mesh({"data": 4, "model": 2})
    assert layout((64, 8), mesh) == P(("data", "model"))  # every device
    assert layout((12, 8), mesh) == P("data")  # 12 % 8 != 0: the larger axis
    assert layout((6, 8), mesh) == P("model")  # only model (2) divides 6
    assert layout((5, 8), mesh) == P(None, ("data", "model"))  # the second axis
    assert layout((5, 3), mesh) == P()  # nothing divides: whole
    assert layout((), mesh) == P()
    assert layout((16,), make_mesh({"data": 8, "model": 1})) == P("data")


def _tree_equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert jax.tree.structure(a) == jax.tree.structure(b) and len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _trained(strategy_cls, setup_cls, cfg):
    model, tx, sopt, state = build_spec(cfg, ONE_HOT)
    strat = strategy_cls(setup_cls.from_config(cfg, 8, ONE_HOT), model, tx, sopt)
    s = strat.prepare(jax.tree.map(np.asarray, state))
    for seed in (0, 1):
        s, _ = strat.train_step(s, strat.put_batch(random_batch(ONE_HOT, 16, seed)))
    return strat, s


@pytest.mark.parametrize("mesh,rules", [
    ("data=4,model=2", "emb/ac:table_wise;emb/b:column_wise;emb/e:data_parallel;.*:row_wise"),
    ("", ".*:row_wise"), ("", "emb/.*:table_wise;.*:data_parallel")])
def test_sync_layout_round_trip_is_exact(mesh, rules):
    strat, s = _trained(SyncStrategy, SyncSetup, tiny_cfg("deepfm", mesh=mesh, rules=rules))
    logical = strat.logical(s)
    _tree_equal(logical.unpadded(), strat.unshard(s))  # the devices' path == the host path
    before = jax.tree.map(np.asarray, s)
    _tree_equal(strat.place_restored(logical), before)


@pytest.mark.parametrize("model_name,mesh", [("deepfm", ""), ("dcn", "data=2,field=4")])
def test_des_layout_round_trip_is_exact(model_name, mesh):
    strat, s = _trained(DesStrategy, DesSetup, tiny_cfg(model_name, mesh=mesh))
    logical = strat.logical(s)
    _tree_equal(logical.unpadded(), strat.unshard(s))
    _tree_equal(strat.place_restored(logical), jax.tree.map(np.asarray, s))


def test_a_sharded_checkpoint_reads_back_on_any_layout(tmp_path):
    strat, s = _trained(SyncStrategy, SyncSetup, tiny_cfg("deepfm", mesh="data=4,model=2"))
    logical = strat.logical(s)
    step = int(logical.step)
    writer = ShardedCheckpointer(str(tmp_path / "ck"), strat.mesh)
    writer.save(step, logical, {"config": {}})
    writer.close()  # waits, reads back, checks
    like = jax.tree.map(np.asarray, strat.unshard(s))
    whole, _ = Checkpointer(str(tmp_path / "ck")).restore(like)  # one device, as GBA reads it
    _tree_equal(whole, like)
    other = make_mesh({"data": 8, "model": 1})
    split, _ = ShardedCheckpointer(str(tmp_path / "ck"), other).restore(like)
    _tree_equal(split, like)
    tables = split.tables["emb/ac"]
    assert tables.sharding == shardings(tables, other)  # each device read only its rows
    # an edited checksum: the step is damaged, on every reader
    path = tmp_path / "ck" / str(step) / "meta" / "metadata"
    meta = json.loads(path.read_text())
    meta["integrity"]["arrays"][-1][3] = "00000000"
    path.write_text(json.dumps(meta))
    for reader in (Checkpointer(str(tmp_path / "ck")), ShardedCheckpointer(str(tmp_path / "ck"),
                                                                           other)):
        with pytest.raises(CheckpointCorruptError, match="checksum mismatch"):
            reader.restore(like)


def test_padded_rows():
    mesh = make_mesh({"data": 4, "model": 2})
    assert padded_rows((13, 8), mesh) == (16, 8)  # 13 rows over 8 devices: 2 each, 3 pad rows
    assert padded_rows((16, 8), mesh) == (16, 8)
    assert padded_rows((5,), mesh) == (8,)
    assert padded_rows((), mesh) == ()
    assert padded_rows((13, 8), make_mesh({"data": 1, "model": 1})) == (13, 8)


def test_a_save_moves_no_rows_of_row_wise_tables():
    """sync on one mesh axis (8 devices), every table row-wise, vocabularies 5..21 (none a
    multiple of 8): `logical` pads each table's rows as the training stores do, so its compiled
    program has no collective (without the pad rows, the odd tables split by columns: an
    all-to-all and an all-gather), and the stored arrays are the host path's plus zero rows."""
    strat, s = _trained(SyncStrategy, SyncSetup, tiny_cfg("deepfm", rules=".*:row_wise"))
    stored = strat.logical(s)
    program = strat._logical_jit.lower(s).compile().as_text()
    for collective in ("all-gather", "all-to-all", "collective-permute", "all-reduce",
                       "reduce-scatter"):
        assert collective not in program
    host = strat.unshard(s)
    for name, table in host.tables.items():
        got = np.asarray(stored.arrays.tables[name])
        assert got.shape == padded_rows(table.shape, strat.mesh) and got.shape[0] % 8 == 0
        np.testing.assert_array_equal(got[: table.shape[0]], table)
        assert not got[table.shape[0]:].any()
        assert stored.arrays.tables[name].sharding.spec == P("data")  # by rows, 8 ways
    assert [x.shape for x in jax.tree.leaves(stored.like())] == [
        np.shape(x) for x in jax.tree.leaves(host)]


def _two_steps(tmp_path):
    """A sync state written at two steps; (checkpoint dir, strategy, state at each step)."""
    strat, s = _trained(SyncStrategy, SyncSetup, tiny_cfg("deepfm", rules=".*:row_wise"))
    ck = ShardedCheckpointer(str(tmp_path / "ck"), strat.mesh)
    first = jax.tree.map(np.asarray, strat.unshard(s))
    ck.save(int(s.step), strat.logical(s), {"config": {}})
    s, _ = strat.train_step(s, strat.put_batch(random_batch(ONE_HOT, 16, 7)))
    second = jax.tree.map(np.asarray, strat.unshard(s))
    ck.save(int(s.step), strat.logical(s), {"config": {}})  # commits the first, no read-back
    ck.close()
    assert sorted(ck._good) == [int(first.step), int(second.step)] and not ck._bad
    return tmp_path / "ck", strat, first, second


def test_a_damaged_shard_is_caught_on_restore_and_the_step_before_is_read(tmp_path, capsys):
    """What the read-back at write time caught (bytes on disk that are not what was written)
    is caught where the bytes are read: a byte flipped in every array file of the newest step
    fails its wsum32s (or its decoding), and every reader falls back to the step before."""
    directory, strat, first, second = _two_steps(tmp_path)
    files = [p for p in (directory / str(int(second.step)) / "state").rglob("*")
             if p.is_file() and p.parent.name == "d"]
    assert files
    for p in files:
        data = bytearray(p.read_bytes())
        data[len(data) // 2] ^= 0x10
        p.write_bytes(bytes(data))
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), second)
    for reader in (Checkpointer(str(directory)), ShardedCheckpointer(str(directory), strat.mesh)):
        got, _ = reader.restore(like)
        _tree_equal(jax.tree.map(np.asarray, got), first)
        assert f"skipped damaged checkpoint step {int(second.step)}" in capsys.readouterr().out


def test_the_commit_check_catches_a_step_without_all_its_arrays(tmp_path):
    """The check when a save commits reads metadata only; it fails a step whose record or
    orbax's array list is not the set of arrays written."""
    directory, strat, first, second = _two_steps(tmp_path)
    ck = ShardedCheckpointer(str(directory), strat.mesh)
    step = int(second.step)
    names = array_names(second)
    assert ck._check_commit(step, names) is None
    assert "does not name" in ck._check_commit(step, names[:-1])
    path = directory / str(step) / "state" / "_METADATA"
    meta = json.loads(path.read_text())
    meta["tree_metadata"].pop(next(iter(meta["tree_metadata"])))
    path.write_text(json.dumps(meta))
    assert "lists" in ck._check_commit(step, names)
    path.unlink()
    assert "cannot be read" in ck._check_commit(step, names)
