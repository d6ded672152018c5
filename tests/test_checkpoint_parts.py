"""Checkpoint parts (recjax/checkpoint_parts.py; issue 38): tables written by the process that
holds them, inside the step's one commit, checked and merged back by every reader.

The holders here are in-process (`LocalPart`); the Ray shard actors' are tested in
tests/test_ray_backend.py. The reference is the state saved whole, without parts.
"""

import json
import pathlib

import jax
import numpy as np
import pytest

from recjax import checkpoint_holder, checkpoint_parts
from recjax.checkpoint import CheckpointCorruptError, Checkpointer
from recjax.checkpoint_sharded import ShardedCheckpointer
from recjax.train.step import TrainState
from sharding.mesh import make_mesh


def _state(seed: int) -> TrainState:
    """Tables of three sizes (one with 13 rows: no even split over 8 devices), Adagrad-like
    slots on two and none on one, dense params and an optimizer state."""
    rng = np.random.default_rng(seed)
    f = lambda *s: rng.normal(size=s).astype(np.float32)  # noqa: E731
    tables = {"emb/a": f(40, 8), "emb/b": f(13, 8), "emb/c": f(64, 4)}
    slots = {"emb/a": {"acc": f(40, 8)}, "emb/b": (), "emb/c": {"acc": f(64, 4)}}
    return TrainState(np.asarray(seed, np.int32), {"w": f(8, 3), "b": f(3)},
                      ({"mu": f(8, 3)},), tables, slots)


class LocalPart:
    """A holder of some tables in this process, with the holder's side of checkpoint_parts."""

    def __init__(self, index: int, state: TrainState, names, fail_write: bool = False):
        self.item, self.names = f"tables_{index}", tuple(names)
        self.tree = checkpoint_parts.split(state, names)[1]
        self.record, bad = checkpoint_holder.record(self.tree)
        assert not bad
        self.fail_write = fail_write
        self.written = []

    def write(self, directory):
        self.written.append(directory)

        def wait():
            if self.fail_write:
                raise OSError("the holder died mid-write")
            checkpoint_holder.write(directory, self.tree)

        return wait

    def verify(self, directory):
        return checkpoint_holder.check(directory, self.tree, self.record)


def _save(ck, state, groups, **kw):
    parts = [LocalPart(i, state, g, **kw) for i, g in enumerate(groups)]
    rest = checkpoint_parts.split(state, [n for g in groups for n in g])[0]
    ck.save(int(state.step), rest, {"note": int(state.step)}, parts=parts)
    return parts


def _same(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


GROUPS = [("emb/a",), ("emb/b", "emb/c")]


def test_parts_restore_to_the_state_saved_whole(tmp_path):
    s = _state(3)
    ck = Checkpointer(str(tmp_path / "ck"))
    parts = _save(ck, s, GROUPS)
    step_dir = tmp_path / "ck" / "3"
    assert {p.name for p in step_dir.iterdir()} >= {"state", "meta", "tables_0", "tables_1"}
    assert all(p.written and ".orbax-checkpoint-tmp" in p.written[0] for p in parts)  # staged
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["3"]  # staging removed
    meta = ck.meta(3)["integrity"]
    assert [p["item"] for p in meta["parts"]] == ["tables_0", "tables_1"]
    assert len(meta["arrays"]) == len(jax.tree.leaves(checkpoint_parts.split(
        s, ["emb/a", "emb/b", "emb/c"])[0]))  # the state item holds no table
    got, m = Checkpointer(str(tmp_path / "ck")).restore(jax.tree.map(np.asarray, s))
    _same(got, s)
    assert list(got.tables) == list(s.tables) and m["note"] == 3
    # a part's table asked with another shape: a mismatch (another model), not damage
    other = s._replace(tables={**s.tables, "emb/c": np.zeros((65, 4), np.float32)})
    with pytest.raises(ValueError, match="tables_1"):
        Checkpointer(str(tmp_path / "ck")).restore(other, step=3)


@pytest.mark.parametrize("how", ["flip", "delete"])
def test_a_damaged_part_falls_back_to_the_newest_good_step(tmp_path, capsys, how):
    ck = Checkpointer(str(tmp_path / "ck"), max_to_keep=3)
    _save(ck, _state(1), GROUPS)
    _save(ck, _state(2), GROUPS)
    # the part's array data: its files of more than 1 KB (its tables are 2.5 KB)
    files = [p for p in (tmp_path / "ck" / "2" / "tables_1").rglob("*")
             if p.is_file() and p.stat().st_size > 1024]
    assert files
    for f in files:
        if how == "flip":
            raw = bytearray(f.read_bytes())
            mid = len(raw) // 2
            raw[mid:mid + 16] = bytes(b ^ 0xFF for b in raw[mid:mid + 16])
            f.write_bytes(bytes(raw))
        else:
            f.unlink()
    got, _ = Checkpointer(str(tmp_path / "ck")).restore(jax.tree.map(np.asarray, _state(2)))
    _same(got, _state(1))
    assert "skipped damaged checkpoint step 2" in capsys.readouterr().out
    with pytest.raises(CheckpointCorruptError):
        Checkpointer(str(tmp_path / "ck")).restore(jax.tree.map(np.asarray, _state(2)), step=2)


def test_a_parts_record_is_checked_against_its_bytes(tmp_path):
    """Bytes that still decode but differ from the part's record (here the record edited):
    the step is damaged, not restored with the wrong values."""
    ck = Checkpointer(str(tmp_path / "ck"))
    _save(ck, _state(4), GROUPS)
    path = tmp_path / "ck" / "4" / "meta" / "metadata"
    meta = json.loads(path.read_text())
    meta["integrity"]["parts"][1]["arrays"][-1][3] = "00000000"
    path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointCorruptError, match="checksum mismatch in tables_1"):
        Checkpointer(str(tmp_path / "ck")).restore(jax.tree.map(np.asarray, _state(4)))


def test_a_holder_that_fails_mid_write_commits_no_step(tmp_path):
    ck = Checkpointer(str(tmp_path / "ck"))
    _save(ck, _state(1), GROUPS)
    with pytest.raises(OSError, match="could not write checkpoint step 2"):
        _save(ck, _state(2), GROUPS, fail_write=True)
    assert ck.all_steps() == [1]
    assert not [p for p in pathlib.Path(tmp_path / "ck").iterdir() if p.name != "1"]
    got, _ = Checkpointer(str(tmp_path / "ck")).restore(jax.tree.map(np.asarray, _state(2)))
    _same(got, _state(1))


def test_a_part_damaged_as_it_was_written_keeps_the_older_steps(tmp_path, capsys):
    """The holder's read-back is the check of a save: a part whose bytes differ from its
    record right after writing marks the step damaged; nothing older is rotated away."""
    ck = Checkpointer(str(tmp_path / "ck"), max_to_keep=1)
    _save(ck, _state(1), GROUPS)
    s = _state(2)
    parts = [LocalPart(i, s, g) for i, g in enumerate(GROUPS)]
    parts[1].record = [[*r[:3], "00000000"] for r in parts[1].record]
    ck.save(2, checkpoint_parts.split(s, ["emb/a", "emb/b", "emb/c"])[0], {}, parts=parts)
    assert "damaged right after writing" in capsys.readouterr().out
    assert ck.all_steps() == [1, 2] and ck.latest_step() == 1


def test_a_sharded_reader_reads_parts_onto_its_mesh(tmp_path):
    """A multi-process run resumes a checkpoint with parts (each device its rows)."""
    s = _state(5)
    ck = Checkpointer(str(tmp_path / "ck"))
    _save(ck, s, GROUPS)
    ck.close()
    mesh = make_mesh({"data": 8, "model": 1})
    got, _ = ShardedCheckpointer(str(tmp_path / "ck"), mesh).restore(jax.tree.map(np.asarray, s))
    _same(got, s)
