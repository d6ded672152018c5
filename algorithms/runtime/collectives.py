"""All-reduce groups with one interface wherever their parties run (`Collectives`).

``clock.Rendezvous`` is one group of parties in one process; `Collectives` is `count` of them
behind ``join(k, index, value)`` / ``close(k)``, the calls a party's role makes from another
process (``ray_wire.RemoteGroup``) when the groups are hosted in an actor of their own
(``placement.rendezvous``, ``placement.parties``). A server that reduces with state of its own
(Persia's NN workers' dense replica, `persia_servers.DenseGroup`) holds a `Collectives` of its
reduce and offers the same two calls.
"""

from __future__ import annotations

import threading
from typing import Any

import jax

from algorithms.runtime.clock import CLOSED, Rendezvous


class Collectives:
    """`count` all-reduce groups of `n` parties each (`clock.Rendezvous`), the object an actor
    of their own hosts (``ray_wire._Host``, ``placement.rendezvous``) when the parties' roles run in
    their worker actors: ShadowSync's MA / BMUF among its trainers, FR's worker j of every
    trainer one group (m groups), the shadows one. A party's `join` waits here until the
    group's n values are in, and every party gets the reduction of the n in party order, as
    in one process; `close` releases the waiting parties (``clock.CLOSED``).

    A star, not a ring: each party sends its value here and gets the result back (2 P bytes
    on the wire per party and sync, where the counters keep the ring's 2 (n-1)/n P, the
    paper's all-reduce), and the reduction runs in this actor."""

    def __init__(self, count: int, n: int, reduce, like=None):
        self.groups = [Rendezvous(n, reduce) for _ in range(count)]
        self._never = threading.Event()  # a party leaves through `close`, not a stop of its own
        if like is not None:  # compiled before the clock runs, as in one process
            jax.block_until_ready(reduce([like] * n))

    def join(self, k: int, index: int, value) -> tuple[bool, Any]:
        """``(closed, result)``: ``clock.CLOSED`` does not survive a trip between processes."""
        out = self.groups[k].join(index, value, self._never)
        return (True, None) if out is CLOSED else (False, out)

    def close(self, k: int) -> None:
        self.groups[k].close()
