"""Feature schema of a dataset: which dense columns and which categorical fields it has.

A `FeatureSpec` is what a data source promises and what the embedding tables and models are
built from. It is deliberately plain data (frozen dataclasses) so it can be printed, compared
and stored in a checkpoint's metadata.
"""

from __future__ import annotations

import dataclasses

# vocab_size of a raw-id field (readers' raw_ids mode): its ids are 64-bit (field, value) keys
# (recjax/data/hashing.py `raw_ids`), not rows, so there is no vocabulary. Every raw id is in
# [0, RAW_VOCAB), so "ids in [0, vocab_size)" still holds; never allocate a table of this size
# (a dynamic-id store holds ``embed.capacity`` rows instead).
RAW_VOCAB = 2**63 - 1

POSITION_SEP = "@"  # position field name: f"{sequence}@{position}" (recjax.models.sequence)


def position_of(name: str) -> tuple[str, int] | None:
    """``(sequence, position)`` when `name` names a position of a behaviour sequence
    (``NAME@i``: a non-empty name, the separator, decimal digits), else None: ``price@usd`` or
    ``@3`` are ordinary field names."""
    seq, sep, pos = name.rpartition(POSITION_SEP)
    if sep and seq and pos.isdigit() and pos.isascii():
        return seq, int(pos)
    return None
POOLINGS = ("sum", "mean")  # over the ids of a multi-hot field (embed.pooling, FieldSpec.pooling)


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """One categorical field.

    Attributes:
      name: column name in the source (``C1``, ``site_id``, ``click_sequence``).
      vocab_size: number of hash buckets (or the exact vocabulary size for id-valued fields);
        ids are always in ``[0, vocab_size)``. `RAW_VOCAB` for a field of raw 64-bit ids.
      max_len: ids per example; 1 for a one-hot field, > 1 for a multi-hot field padded with a mask.
      table: embedding table the field looks up; fields naming the same table share it.
        Defaults to the field's own name.
      pooling: "sum" or "mean" over the ids of a multi-hot field; "" = the run's
        ``embed.pooling``. (The embedding dim is the model's ``embed_dim`` for every field: the
        models' activations are one ``[B, F, D]`` tensor, DESIGN.md section 1.)
    """

    name: str
    vocab_size: int
    max_len: int = 1
    table: str = ""
    pooling: str = ""

    def __post_init__(self):
        if self.vocab_size < 1:
            raise ValueError(f"field {self.name!r}: vocab_size must be >= 1, got {self.vocab_size}")
        if self.max_len < 1:
            raise ValueError(f"field {self.name!r}: max_len must be >= 1, got {self.max_len}")
        if self.pooling and self.pooling not in POOLINGS:
            raise ValueError(f"field {self.name!r}: pooling must be sum or mean, got {self.pooling!r}")
        if not self.table:
            object.__setattr__(self, "table", self.name)

    @property
    def raw_ids(self) -> bool:
        """Whether the field's ids are raw 64-bit keys (no vocabulary, see `RAW_VOCAB`)."""
        return self.vocab_size == RAW_VOCAB


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """Schema of a batch: ``dense f32[B, n_dense]``, ``ids i32[B, F, L]``, ``label f32[B]``.

    ``ids`` is i64 when a reader runs with ``raw_ids`` (its hashed fields then have `RAW_VOCAB`).

    Attributes:
      dense_names: names of the dense (numerical) columns, in batch order.
      fields: categorical fields, in batch order (axis F of ``ids``).
    """

    dense_names: tuple[str, ...]
    fields: tuple[FieldSpec, ...]

    def __post_init__(self):
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate field names in {names}")
        by_table: dict[str, int] = {}
        for f in self.fields:
            if by_table.setdefault(f.table, f.vocab_size) != f.vocab_size:
                raise ValueError(
                    f"fields sharing table {f.table!r} disagree on vocab_size "
                    f"({by_table[f.table]} vs {f.vocab_size}); give them one size")

    @property
    def n_dense(self) -> int:
        return len(self.dense_names)

    @property
    def n_fields(self) -> int:
        return len(self.fields)

    @property
    def max_len(self) -> int:
        """L: the padded number of ids per field (1 when every field is one-hot)."""
        return max((f.max_len for f in self.fields), default=1)

    @property
    def multi_hot(self) -> bool:
        return self.max_len > 1

    @property
    def masked(self) -> bool:
        """Whether a batch of this spec carries a mask: some field is multi-hot, or holds a
        position of a behaviour sequence (``NAME@i``, one-hot with mask 0 past the example's
        length: `recjax.models.sequence`)."""
        return self.multi_hot or any(position_of(f.name) for f in self.fields)

    def field(self, name: str) -> FieldSpec:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"no field {name!r}; fields are {[f.name for f in self.fields]}")
