"""How a behaviour sequence reaches a sequence model (DIN): one one-hot field per position.

A behaviour sequence of up to L ids (a multi-hot field ``click_sequence`` of ``max_len`` L) is
carried as L one-hot *position fields* ``click_sequence@0 .. click_sequence@{L-1}`` that share the
sequence's table, with ``mask[b, f, 0] = 0`` at the positions past the example's length:

* the embedding side needs nothing new: the pooled lookup of a one-hot field with mask 0 is the
  zero vector, and `recjax.embeddings.row_gradients` sends a masked position's gradient to the
  out-of-range row V, which every sparse optimizer drops;
* the sparse/dense boundary stays ``acts["emb"]: f32[B, F, D]`` (DESIGN.md section 1), so every
  algorithm's communication (sync's routed lookups, Persia's activations and their compression,
  the PS pulls and pushes of async / GBA / ShadowSync) carries a sequence with no change;
* a model finds its sequences by name (`sequences`) and the target each attends to: the one other
  field that shares the sequence's table (Taobao's ``adgroup_id`` for ``click_sequence``).

This is the "padded with lengths" layout of issue 39 (the mask is the lengths); values + offsets
would need a boundary of another shape through every algorithm. It is not as fast: the padding is
looked up and weighed too, and docs/models.md gives what that costs against values + offsets
(``python -m recjax.tools.bench_seq_layout``).

`unroll_spec` / `unroll_chunk` turn a multi-hot field into position fields (used by the data
kind ``seq:KIND:PATH``, recjax/data/synthetic_seq.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from recjax.batch import Chunk
from recjax.features import POSITION_SEP, FeatureSpec, FieldSpec, position_of

SEP = POSITION_SEP  # position field name = f"{sequence}{SEP}{position}"


def position_name(sequence: str, position: int) -> str:
    return f"{sequence}{SEP}{position}"


@dataclasses.dataclass(frozen=True)
class Sequence:
    """One behaviour sequence found in a `FeatureSpec`.

    Attributes:
      name: the sequence (``click_sequence``).
      positions: field indices of positions 0..L-1, in order.
      target: field index of the field it attends to (the one other field of its table).
    """

    name: str
    positions: tuple[int, ...]
    target: int


def required_sequences(spec: FeatureSpec, model: str) -> tuple[Sequence, ...]:
    """`sequences` of `spec` for a sequence model, which needs one at least, all of one length.

    Raises:
      ValueError: no sequence, or sequences of different lengths (both named for `model`).
    """
    seqs = sequences(spec, model)
    if not seqs:
        raise ValueError(
            f"{model}: the data has no behaviour sequence (position fields NAME@0..NAME@{{L-1}}); "
            "read a multi-hot field as one with --data seq:KIND:PATH (e.g. "
            "seq:taobao:taobao_ad_tiny/train_sample.csv), or use --data synthetic-seq")
    lengths = {len(s.positions) for s in seqs}
    if len(lengths) != 1:
        raise ValueError(f"{model}: the sequences {[s.name for s in seqs]} have different "
                         f"lengths {sorted(lengths)}; give them one --data.multi_hot_len")
    return seqs


def sequences(spec: FeatureSpec, model: str = "din") -> tuple[Sequence, ...]:
    """The behaviour sequences of `spec`, in order of their first position.

    Raises:
      ValueError: positions missing or out of order, positions of one sequence in several
        tables, or a sequence whose table no other field (the target) shares, or shares with
        several.
    """
    by_seq: dict[str, dict[int, int]] = {}
    for i, f in enumerate(spec.fields):
        at = position_of(f.name)
        if at:
            by_seq.setdefault(at[0], {})[at[1]] = i
    out = []
    for seq, pos in by_seq.items():
        if sorted(pos) != list(range(len(pos))):
            raise ValueError(f"{model}: sequence {seq!r} has position fields {sorted(pos)}; "
                             f"expected {seq}{SEP}0 .. {seq}{SEP}{len(pos) - 1}")
        idx = tuple(pos[p] for p in range(len(pos)))
        tables = {spec.fields[i].table for i in idx}
        if len(tables) != 1:
            raise ValueError(f"{model}: the positions of sequence {seq!r} look up several tables "
                             f"{sorted(tables)}; they must share one (the target's)")
        table = tables.pop()
        targets = [i for i, f in enumerate(spec.fields) if f.table == table and i not in idx]
        if len(targets) != 1:
            names = [spec.fields[i].name for i in targets]
            raise ValueError(f"{model}: sequence {seq!r} (table {table!r}) needs exactly one other "
                             f"field of that table to attend to (its target), found {names}; "
                             "give the target field the sequence's table")
        out.append(Sequence(seq, idx, targets[0]))
    return tuple(sorted(out, key=lambda s: s.positions[0]))


def unroll_spec(spec: FeatureSpec) -> FeatureSpec:
    """Every multi-hot field of `spec` as ``max_len`` one-hot position fields in its place.

    The positions keep the field's table (and so share rows with its target) and pooling.
    """
    fields: list[FieldSpec] = []
    for f in spec.fields:
        if f.max_len == 1:
            fields.append(f)
            continue
        fields += [FieldSpec(position_name(f.name, p), f.vocab_size, table=f.table,
                             pooling=f.pooling) for p in range(f.max_len)]
    return FeatureSpec(spec.dense_names, tuple(fields))


def unroll_chunk(chunk: Chunk, spec: FeatureSpec) -> Chunk:
    """`chunk` of `spec` (ids, mask ``[N, F, L]``) in the layout of `unroll_spec` (``[N, F', 1]``).

    A one-hot field keeps position 0 of its ids and mask; a multi-hot field's L positions become
    L fields. Without a mask (every field one-hot) the chunk is returned unchanged.
    """
    if chunk.mask is None or not spec.multi_hot:
        return chunk
    cols = [np.arange(f.max_len) if f.max_len > 1 else np.zeros(1, np.int64) for f in spec.fields]
    field = np.concatenate([np.full(len(c), i) for i, c in enumerate(cols)])
    pos = np.concatenate(cols)
    ids = chunk.ids[:, field, pos][:, :, None]
    mask = chunk.mask[:, field, pos][:, :, None]
    return chunk._replace(ids=np.ascontiguousarray(ids), mask=np.ascontiguousarray(mask))
