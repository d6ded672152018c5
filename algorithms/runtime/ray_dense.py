"""Async's dense PS (and S-EASGD's sync PS, Persia's NN workers' dense group) sharded by
parameter blocks across actors (``--ray.dense_shards D``).

With the roles in the actors (``ray_roles.py``) every worker pulls the dense params and pushes
its dense gradient once per step; one dense PS actor serves all of them one at a time per
request and, at the issue's figures (2 MB each way on dlrm_kaggle), it would cap the run near
60 steps/s on its own. Downpour SGD shards its PS instead (Dean et al. 2012, Sec. 4.1): here D
actors each hold a block of whole parameter arrays (`dense_blocks.blocks`, by size) with their
optimizer state, and apply the gradients of their own block as they arrive. `DenseShards` is
`ps.DensePS`'s interface over them: a worker's pull and push go to every block at once and are
waited for together; the driver reads the params, optimizer state and a snapshot joined into the
single-process layout (checkpoints resume on threads and back).

Staleness is block 0's (the blocks take the same pushes, each in its own arrival order).
Global-norm clipping (``dense.clip_norm``) needs the whole gradient, so it refuses D > 1.
"""

from __future__ import annotations

from typing import Any

import jax

from algorithms.runtime.dense_blocks import join, pick
from algorithms.runtime.ps import DensePS
from algorithms.runtime.ray_backend import _ray
from algorithms.runtime.ray_wire import host_value


def dense_ps(params: Any, opt_state: Any, dense_cfg) -> DensePS:
    """A `ps.DensePS` whose optimizer is built here from the config's ``dense`` section: the
    factory of a dense PS (or one block of it) hosted in an actor of its own
    (`placement.Placement.dense_ps`)."""
    from recjax.train.setup import make_dense_tx
    from recjax.train.step import apply_dense

    tx = make_dense_tx(dense_cfg)
    return DensePS(params, opt_state, jax.jit(lambda p, o, g: apply_dense(tx, p, o, g)))


def _shape(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


class _Blocks:
    """Block servers `servers` (`ray_wire.Hosted` proxies), block s holding the leaves
    `cut[s]` of params shaped as `params`; picklable, so a worker actor calls them itself."""

    def __init__(self, servers: list, cut: list[list[int]], params: Any):
        self.servers, self.cut = servers, cut
        self.pdef = jax.tree.structure(params)
        self._params = _shape(params)

    def _all(self, method: str, *per_block) -> list:
        """`method` on every block at once, waited for together; `per_block[k][s]`: block
        s's k-th argument."""
        ray = _ray()
        refs = [h._handle.call.remote(method, *(host_value(a[s]) for a in per_block))
                for s, h in enumerate(self.servers)]
        return ray.get(refs)

    def _cut(self, tree: Any) -> list:
        return [pick(tree, self.pdef, b) for b in self.cut]


class SyncShards(_Blocks):
    """`ps.SyncPS`'s interface (S-EASGD's sync PS, ``wPS``) over block servers of it: an
    exchange sends each block of ``w_i`` to its server at once and joins the new ``w_i``.
    Alg. 1-2's exchange moves each entry of ``wPS`` and ``w_i`` by its own pair of values, so
    each block's exchange is the whole one's for its leaves. Each block takes the exchanges in
    its own arrival order (as Downpour's PS shards take pushes): two trainers' exchanges may
    reach two blocks in different orders, where one server makes them one sequence."""

    def exchange(self, w_i: Any) -> Any:
        return join(self._all("exchange", self._cut(w_i)), self._params, self.pdef)

    def snapshot(self) -> Any:
        return join(self._all("snapshot"), self._params, self.pdef)

    def restore(self, w: Any) -> None:
        self._all("restore", self._cut(w))


class DenseShards(_Blocks):
    """`ps.DensePS`'s interface over the block servers `servers` (`ray_wire.Hosted` proxies of
    `ps.DensePS`), block s holding the leaves `cut[s]` of params shaped as `params`, optimizer
    state as `opt_state`; picklable, so a worker actor calls the servers itself."""

    def __init__(self, servers: list, cut: list[list[int]], params: Any, opt_state: Any):
        super().__init__(servers, cut, params)
        self._opt = _shape(opt_state)

    def pull(self) -> tuple[Any, tuple[int, ...]]:
        got = self._all("pull")
        return join([p for p, _ in got], self._params, self.pdef), tuple(v for _, v in got)

    def push(self, grads: Any, version: tuple[int, ...]) -> None:
        self._all("push", self._cut(grads), version)

    def snapshot(self) -> tuple[Any, Any]:
        got = self._all("snapshot")
        return (join([p for p, _ in got], self._params, self.pdef),
                join([o for _, o in got], self._opt, self.pdef))

    def restore(self, params: Any, opt_state: Any) -> None:
        self._all("restore", self._cut(params), self._cut(opt_state))

    def _joined(self, name: str, like: Any) -> Any:
        """Attribute `name` of every block (read at once), joined like `like`."""
        ray = _ray()
        parts = ray.get([h._handle.attr.remote(name) for h in self.servers])
        return join(jax.device_get(parts), like, self.pdef)

    @property
    def params(self) -> Any:
        return self._joined("params", self._params)

    @property
    def opt_state(self) -> Any:
        return self._joined("opt_state", self._opt)

    @property
    def version(self) -> int:
        return self.servers[0].version

    @property
    def staleness(self):
        return self.servers[0].staleness


class GroupBlocks(_Blocks):
    """A server with `collectives.Collectives`' calls (Persia's `DenseGroup`) cut into block
    servers `servers`, block s of the leaves `cut[s]` of every dense tree it holds: its parties
    join every block at once (``ray_wire.BlockGroup``, `placement.parties`); a read ``m()``
    is every block's at once, joined like ``joins[m]`` (the whole trees' layout), or block 0's
    (a count every block keeps alike: every block reduces every step of the same parties)."""

    def __init__(self, servers: list, cut: list[list[int]], params: Any, joins: dict):
        super().__init__(servers, cut, params)
        self._joins = {m: _shape(like) for m, like in joins.items()}

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)

        def read():
            parts = self._all(name)
            if name not in self._joins:
                return parts[0]
            return join(jax.device_get(parts), self._joins[name], self.pdef)

        return read
