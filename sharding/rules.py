"""The sharding rule table: ``(regex over table name, sharding type)``, first match wins.

Written in the config as ``--spmd.table_rules="emb/C1[0-9]:table_wise;wide/.*:data_parallel;.*:row_wise"``
(big_vision's rule tables, torchrec's sharding type names). Table names are
``"{group}/{table}"`` (``emb/C1``, ``wide/C1``; see `recjax.embeddings.make_layout`). A table no
rule matches falls back to the algorithm's default type.

Sharding types (torchrec ``ShardingType``), on the mesh's table axis of size M:

* ``data_parallel``: every device holds the whole table (and its optimizer slots);
* ``table_wise``: the whole table lives on one shard, tables spread over shards by size;
* ``row_wise``: rows split into M contiguous blocks (the table padded to a multiple of M);
* ``column_wise``: the embedding dim split into M blocks (D must be divisible by M).
"""

from __future__ import annotations

import re

SHARDING_TYPES = ("data_parallel", "table_wise", "row_wise", "column_wise")


def parse_rules(text: str) -> tuple[tuple[str, str], ...]:
    """``"re:type;re:type"`` -> ``((re, type), ...)``, each regex compiled once to check it.

    Raises:
      ValueError: a rule without ``:``, an unknown type, or a regex that does not compile.
    """
    rules = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        pattern, sep, kind = part.rpartition(":")
        if not sep or not pattern:
            raise ValueError(f"spmd.table_rules: rule {part!r} must look like REGEX:TYPE, e.g. "
                             "'emb/.*:row_wise'")
        if kind not in SHARDING_TYPES:
            raise ValueError(f"spmd.table_rules: rule {part!r} has unknown sharding type {kind!r}; "
                             f"types: {', '.join(SHARDING_TYPES)}")
        try:
            re.compile(pattern)
        except re.error as e:
            raise ValueError(f"spmd.table_rules: rule {part!r}: bad regex ({e})") from None
        rules.append((pattern, kind))
    return tuple(rules)


def resolve(rules: tuple[tuple[str, str], ...], tables: list[str], default: str) -> dict[str, str]:
    """Sharding type of every table: the first rule whose regex fully matches its name.

    Raises:
      ValueError: a rule that matches no table (a typo, or a table this model does not have).
    """
    unknown = [f"{p}:{k}" for p, k in rules if not any(re.fullmatch(p, t) for t in tables)]
    if unknown:
        raise ValueError(f"spmd.table_rules: rule(s) {unknown} name no table of this model; "
                         f"tables are {', '.join(tables)} (names are group/table)")
    out = {}
    for name in tables:
        out[name] = next((kind for pattern, kind in rules if re.fullmatch(pattern, name)), default)
    return out
