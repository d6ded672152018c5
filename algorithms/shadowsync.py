"""ShadowSync (S-EASGD, S-MA, S-BMUF) and its foreground baselines (FR-EASGD, FR-MA, FR-BMUF).

Zheng et al., arXiv 2003.03477, Algorithms 1-4 and Sec. 3-4. n trainers x m Hogwild worker
threads; the embeddings live once on the sharded embedding PS (``ps.EmbeddingPS``); each trainer
has a dense replica ``w_i`` (`runtime.Replica`) shared lock-free by its workers.

* ``--algo shadow`` (Alg. 1): one background *shadow* role per trainer loops the sync rule with
  no knowledge of training (``sync_rules``: S-EASGD through a `ps.SyncPS`, S-MA / S-BMUF through
  an all-reduce among the shadow roles), pausing ``runtime.shadow_interval_ms`` between syncs.
* ``--algo fr``: no shadow; every worker syncs its trainer's replica itself after every
  ``k = runtime.sync_gap`` of its iterations (worker j of every trainer all-reduce together).

The returned model is trainer 1's replica (the paper) or, with ``runtime.return_model=average``,
the replicas' average. Reported: average sync gap (Sec. 4.1.1: iterations/sec over syncs/sec,
per trainer), syncs/sec, bytes moved by syncs and by the embedding PS.

    python scripts/train.py --algo shadow --sync easgd --trainers 4 --workers-per-trainer 3
    python scripts/train.py --algo fr --sync ma --sync-gap 10 --deterministic
"""

from __future__ import annotations

import numpy as np

from algorithms import sync_rules
from algorithms.runtime import (
    Collective,
    Counters,
    Rendezvous,
    Replica,
    RoleSpec,
    Runtime,
    Work,
    Worker,
    intervals,
)
from algorithms.runtime.ps import SyncPS
from recjax.config import Config


def make_rule(cfg: Config) -> sync_rules.SyncRule:
    rc = cfg.shadowsync
    return sync_rules.SyncRule(rc.sync, rc.alpha, rc.bmuf_lr, rc.bmuf_momentum, rc.nesterov,
                               sequential=rc.easgd_form == "sequential")


class Syncer:
    """One party's sync of one replica: the code shadow roles and FR workers share.

    `step` is a generator: ``yield from syncer.step(rt, counters)`` performs one sync (its
    communication is a `Work` over the sync PS link, or a `Collective`), updates the replica
    and counts it in the role's `counters`. It holds no engine (`rt` is the role's), so a role
    run in its worker actor takes it there (``--ray.roles actors``: its replica is that
    actor's, its sync PS a hosted one).
    """

    def __init__(self, rule: sync_rules.SyncRule, replica: Replica, index: int,
                 server: SyncPS | None, group: Rendezvous | None):
        self.rule, self.replica, self.index = rule, replica, index
        self.server, self.group = server, group
        self.bmuf = sync_rules.bmuf_init(replica.params) if rule.collective else None

    def step(self, rt: Runtime, counters: Counters):
        p = rt.dense_bytes
        if self.rule.name == "easgd":  # send w_i, receive wPS: 2P bytes on the shared PS link
            yield Work(transfers=((rt.dense_link, 2 * p),))
            self.replica.params = self.server.exchange(self.replica.params)
            counters.sync_bytes += 2 * p
        else:  # ring all-reduce: 2 (n-1)/n P bytes per party over its own link
            n = self.group.n
            nbytes = int(2 * (n - 1) / n * p)
            mean = yield Collective(self.group, self.index, self.replica.params,
                                    nbytes / rt.bandwidth)
            self.bmuf, self.replica.params = self.rule.local(self.bmuf, mean, self.replica.params)
            counters.sync_bytes += nbytes
        counters.syncs += 1


def shadow_role(rt: Runtime, shadow, syncer: Syncer, pause: float):
    """Alg. 1's background thread: sync, pause, forever (until training ends); its syncs
    counted in ``shadow.counters``."""
    try:
        while True:
            yield from syncer.step(rt, shadow.counters)
            yield Work(pause=pause)
    finally:
        if syncer.group is not None:
            syncer.group.close()


def sync_server(params, rule: sync_rules.SyncRule) -> SyncPS:
    """S-EASGD's sync PS holding ``wPS``, its exchange compiled (where the placement hosts it:
    here, or in an actor of its own when the roles run in theirs)."""
    rule.exchange(params, params)
    return SyncPS(params, rule.exchange)


def worker_role(rt: Runtime, worker: Worker, replica: Replica, syncer: Syncer | None, k: int):
    """A Hogwild worker thread; with a `syncer` it syncs every `k` of its iterations (FR)."""
    try:
        it = 0
        while (item := worker.take()) is not None:
            g_params, pending, work = worker.compute(replica.params, item, it)
            yield work
            worker.push(pending)
            replica.apply(rt.dense_apply, g_params)
            it += 1
            if syncer is not None and it % k == 0:  # after iterations k, 2k, ... (not at 0)
                yield from syncer.step(rt, worker.counters)
    finally:
        if syncer is not None and syncer.group is not None:
            syncer.group.close()  # peers waiting on this worker are released


def run(cfg: Config) -> dict:
    """``--algo shadow`` / ``--algo fr``: train, evaluate, return (and write) the summary."""
    return intervals.run(cfg, cfg.runtime.hogwild_workers, interval)  # n x m worker roles


def interval(rt: Runtime) -> dict:
    """One checkpoint interval of the run (`intervals.run`); its `Runtime.finish`."""
    cfg = rt.cfg
    rule = make_rule(cfg)
    rc, sc = cfg.runtime, cfg.shadowsync
    foreground = cfg.train.algo == "fr"
    n, m = rc.trainers, rc.workers_per_trainer
    s0 = rt.init_state
    # trainer i's replica, where its roles run: here, or (Ray, roles in the actors) in its
    # worker group's actor, with its m workers and its shadow
    replicas = [rt.placement.beside(i, Replica, s0.params, s0.opt_state, group_size=m)
                for i in range(n)]
    # The EASGD sync PS lives beside the roles: in this process while they run here (under
    # Ray with the roles in the driver a sync PS actor of its own moved each exchange's
    # 2 x 2 MB (dlrm_kaggle) through two processes, and the shadow roles exchange back to
    # back: S-EASGD on Ray 0.55 -> 0.80x of threads on the 2-core box, docs/performance.md),
    # in an actor of its own when they run in theirs.
    # (cut into blocks across actors with --ray.dense_shards, `placement.host_blocks`)
    server = (rt.placement.host_blocks(SyncPS, sync_server, s0.params, rule, near_roles=True)
              if rule.name == "easgd" else None)
    # MA / BMUF: the all-reduce groups, FR's worker j of every trainer one group, the shadows
    # one; here, or (Ray, roles in the actors) hosted in an actor of their own
    groups = [None] * m
    if rule.collective:  # compile before threads start
        rule.local(sync_rules.bmuf_init(s0.params), s0.params, s0.params)
        groups = rt.placement.rendezvous(m if foreground else 1, n, rule.mean, s0.params)

    def syncer(i: int, group, name: str) -> Syncer:
        """Trainer i's party of `group`, beside its replica (its BMUF state lives there)."""
        return rt.placement.beside(i, Syncer, rule, replicas[i], i, server, group,
                                   group_size=m, name=name)

    def closes(group):
        """A party's actor died (Ray, roles in the actors): its peers stop waiting for it, as
        the role's own ``finally`` does where the role runs here."""
        return None if group is None else (lambda _: group.close())

    supply = rt.static_shards()
    syncers: list[Syncer] = []  # every party of a sync, in a fixed order (their BMUF states)
    # under Ray a trainer is one process: its m workers are threads of its actor
    workers = [rt.placement.worker(w, supply, group=w // m, group_size=m)
               for w in range(rt.num_workers)]
    sync_counters = [Counters() for _ in range(n)]
    roles = []
    for i in range(n):
        for j in range(m):
            w = workers[i * m + j]
            party = None
            if foreground and rule.name != "none":
                party = syncer(i, groups[j], f"Syncer-w{j}")
                syncers.append(party)
            roles.append(RoleSpec(f"t{i}-worker{j}", rt.placement.run_role(
                worker_role, w, replicas[i], party, sc.sync_gap,
                lost=closes(groups[j] if party is not None else None))))
    if not foreground and rule.name != "none":
        for i in range(n):
            party = syncer(i, groups[0], "Syncer-shadow")
            syncers.append(party)
            shadow = rt.placement.companion(i, sync_counters[i], group_size=m)
            roles.append(RoleSpec(f"t{i}-shadow", rt.placement.run_role(
                shadow_role, shadow, party, sc.shadow_interval_ms * 1e-3,
                lost=closes(groups[0])), foreground=False))

    counters = sync_counters + [w.counters for w in workers]
    # what a checkpoint keeps beyond the train state (`Runtime.own`): every replica as it is,
    # wPS, the BMUF states, and the whole run's counters (syncs, sync bytes, iterations), so
    # an interval's end or a --resume goes on from them instead of from the returned model
    base = restore_own(rt, replicas, server, syncers)

    def totals() -> tuple[int, int, int]:
        return (int(base[0]) + sum(c.syncs for c in counters),
                int(base[1]) + sum(c.sync_bytes for c in counters),
                int(base[2]) + sum(w.counters.iterations for w in workers))

    rt.own = lambda: own_state(replicas, server, syncers, totals())

    def result():
        if sc.return_model == "first":
            return replicas[0].params, replicas[0].opt_state
        return sync_rules.tree_mean([r.params for r in replicas]), replicas[0].opt_state

    def snapshot():
        return (*result(), rt.start_step + sum(w.counters.iterations for w in workers))

    def live() -> dict:  # counters over time (metrics.jsonl `counters` records)
        syncs, nbytes, iters = totals()
        return {"syncs": syncs, "avg_sync_gap": (iters / syncs) if syncs else None,
                "sync_bytes": nbytes}

    sched = rt.execute(roles, supply, workers=workers, snapshot=snapshot, counters=live)
    syncs, nbytes, iters = totals()  # the whole run's (every interval, every --resume)
    secs = max(rt.progress.train_seconds + sched.seconds, 1e-12)  # likewise
    extra = {
        "sync_rule": rule.name, "alpha": rule.alpha, "sync_mode": "fr" if foreground else "shadow",
        "sync_gap_k": sc.sync_gap if foreground else None,
        "syncs": syncs, "syncs_per_sec": syncs / n / secs,
        "iterations_per_sec": iters / n / secs,
        # Sec. 4.1.1: average sync gap = (iterations/sec) / (syncs/sec), per trainer.
        "avg_sync_gap": (iters / syncs) if syncs else None,
        "sync_bytes": nbytes,
        "return_model": sc.return_model,
    }
    params, opt_state = result()
    return rt.finish(params, opt_state, sched, workers, extra)


def own_state(replicas: list[Replica], server: SyncPS | None, syncers: list[Syncer],
              totals: tuple[int, int, int]) -> dict:
    """The arrays a ShadowSync checkpoint holds beside the train state (which holds the
    returned model only): each trainer's replica (params, optimizer state), wPS (EASGD), each
    party's BMUF state, and the run's (syncs, sync bytes, worker iterations)."""
    out = {"replicas": [(r.params, r.opt_state) for r in replicas],
           "counters": np.asarray(totals, np.int64)}
    if server is not None:
        out["center"] = server.snapshot()
    if any(s.bmuf is not None for s in syncers):
        out["bmuf"] = [s.bmuf for s in syncers]
    return out


def restore_own(rt: Runtime, replicas: list[Replica], server: SyncPS | None,
                syncers: list[Syncer]) -> np.ndarray:
    """Put back what `own_state` saved with the checkpoint this call starts from; returns the
    run's counters so far (zeros for a fresh start, or a checkpoint without them, e.g. a sync
    run's: then every replica starts from its model, as before)."""
    got = rt.restore_own(own_state(replicas, server, syncers, (0, 0, 0)))
    if got is None:
        return np.zeros(3, np.int64)
    for r, (params, opt_state) in zip(replicas, got["replicas"]):
        r.params, r.opt_state = params, opt_state
    if server is not None:
        server.restore(got["center"])
    for s, b in zip(syncers, got.get("bmuf", ())):
        s.bmuf = b
    return np.asarray(got["counters"])
