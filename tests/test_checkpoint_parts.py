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


# -- a restore whose tables their holders read (`Checkpointer.restore(loader=)`) -------------

class LocalLoader:
    """Holders of the tables `groups` in this process, each reading its own tables of a step
    with the holder's side (`checkpoint_holder.load`), as a Ray shard actor does."""

    def __init__(self, groups):
        self.groups = [tuple(g) for g in groups]
        self.names = tuple(n for g in self.groups for n in g)
        self.held = [None] * len(self.groups)
        self.read = []  # the item directories each load read

    def load(self, sources):
        for i, g in enumerate(self.groups):
            srcs = sources(g)
            self.read.append(sorted(pathlib.Path(s.directory).name for s in srcs))
            try:
                self.held[i] = checkpoint_holder.load(srcs)
            except Exception as e:  # the actor's answer: why, in words
                return f"holder {i}: {e}"
        return None

    def tables(self):
        """``(tables, slots)`` the holders hold, merged."""
        t, s = {}, {}
        for tables, slots in self.held:
            t.update(tables)
            s.update(slots)
        return t, s


def _spied(monkeypatch):
    """The arrays this process reads: `Checkpointer._restore_item`'s items and `read_rest`'s
    abstract trees, recorded."""
    from recjax import checkpoint as ck_mod

    seen = []
    item, rest = Checkpointer._restore_item, checkpoint_parts.read_rest

    def restore_item(self, step, name, abstract, strict=True):
        seen.append((name, abstract))
        return item(self, step, name, abstract, strict)

    def read_rest(directory, like):
        seen.append(("state(partial)", like))
        return rest(directory, like)

    monkeypatch.setattr(Checkpointer, "_restore_item", restore_item)
    monkeypatch.setattr(ck_mod.checkpoint_parts, "read_rest", read_rest)
    return seen


def _expect_loaded(got, loader, s):
    """`got` is `s` without tables; the loader's holders hold `s`'s tables and slots."""
    _same(got, s._replace(tables={}, slots={}))
    tables, slots = loader.tables()
    _same({k: tables[k] for k in s.tables}, s.tables)
    _same({k: slots[k] for k in s.slots}, s.slots)


@pytest.mark.parametrize("saved", ["parts", "whole"])
def test_holders_read_their_own_tables_and_this_process_none(tmp_path, monkeypatch, saved):
    """Parts written by one grouping of holders, or a checkpoint saved whole (a threads run),
    read by holders grouped otherwise: each gets its tables bit for bit from the item that has
    them; this process reads every other array and no table."""
    s = _state(6)
    ck = Checkpointer(str(tmp_path / "ck"))
    if saved == "parts":
        _save(ck, s, GROUPS)
    else:
        ck.save(6, s, {"note": 6})
    seen = _spied(monkeypatch)
    loader = LocalLoader([("emb/c", "emb/a"), ("emb/b",)])
    got, meta = Checkpointer(str(tmp_path / "ck")).restore(jax.tree.map(np.asarray, s),
                                                           loader=loader)
    assert meta["note"] == 6
    _expect_loaded(got, loader, s)
    assert [name for name, _ in seen] == (["state"] if saved == "parts" else ["state(partial)"])
    assert all(not like.tables and not like.slots for _, like in seen)  # no table read here
    assert loader.read == ([["tables_0", "tables_1"], ["tables_1"]] if saved == "parts"
                           else [["state"], ["state"]])


@pytest.mark.parametrize("saved", ["parts", "whole"])
def test_a_table_a_holder_finds_damaged_fails_the_step(tmp_path, capsys, saved):
    """A holder's read that fails its CRC (bytes flipped in a table's files) skips the step
    as a bad CRC here does; the holders then read the step before."""
    ck = Checkpointer(str(tmp_path / "ck"), max_to_keep=3)
    for seed in (1, 2):
        if saved == "parts":
            _save(ck, _state(seed), GROUPS)
        else:
            ck.save(seed, _state(seed), {})
    item = "tables_1" if saved == "parts" else "state"
    files = [p for p in (tmp_path / "ck" / "2" / item).rglob("*")
             if p.is_file() and p.stat().st_size > 1024]
    assert files
    for f in files:
        raw = bytearray(f.read_bytes())
        mid = len(raw) // 2
        raw[mid:mid + 16] = bytes(b ^ 0xFF for b in raw[mid:mid + 16])
        f.write_bytes(bytes(raw))
    loader = LocalLoader(GROUPS)
    got, _ = Checkpointer(str(tmp_path / "ck")).restore(jax.tree.map(np.asarray, _state(2)),
                                                        loader=loader)
    assert "skipped damaged checkpoint step 2" in capsys.readouterr().out
    _expect_loaded(got, loader, _state(1))


def test_a_table_of_another_shape_is_a_mismatch_not_damage(tmp_path):
    s = _state(3)
    ck = Checkpointer(str(tmp_path / "ck"))
    ck.save(3, s, {})
    other = s._replace(tables={**s.tables, "emb/c": np.zeros((65, 4), np.float32)})
    with pytest.raises(ValueError, match=r"\['tables'\]\['emb/c'\]: checkpoint float32\[64, 4\]"):
        Checkpointer(str(tmp_path / "ck")).restore(other, loader=LocalLoader(GROUPS))


@pytest.mark.parametrize("saved", ["parts", "whole"])
def test_a_holder_checks_its_tables_against_the_record(tmp_path, saved):
    """Bytes that decode but differ from the step's record (the record of a slot edited): the
    holder that reads them finds the mismatch, and the step is damaged."""
    s = _state(4)
    ck = Checkpointer(str(tmp_path / "ck"))
    if saved == "parts":
        _save(ck, s, GROUPS)
    else:
        ck.save(4, s, {})
    path = tmp_path / "ck" / "4" / "meta" / "metadata"
    meta = json.loads(path.read_text())
    rows = meta["integrity"]["parts"][1]["arrays"] if saved == "parts" else meta["integrity"][
        "arrays"]
    row = next(r for r in rows if "emb/c" in r[0] and "slots" in r[0])
    row[3] = "00000000"
    path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointCorruptError, match=r"holder 0: checksum mismatch in "
                                                     r"(tables_1|state): \['slots'\]\['emb/c'\]"):
        Checkpointer(str(tmp_path / "ck")).restore(jax.tree.map(np.asarray, s), step=4,
                                                   loader=LocalLoader([("emb/c", "emb/a"),
                                                                       ("emb/b",)]))
