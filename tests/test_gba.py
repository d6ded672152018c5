"""GBA and its baselines (Su et al. 2022): limiting cases, drops, determinism, no busy waits.

Equal speeds here means no stragglers, the same modelled compute per batch and free links
(infinite bandwidth), so that workers finish each batch at the same virtual instant.
"""

import collections
import contextlib
import dataclasses
import heapq
import json

import jax
import numpy as np
import pytest

from algorithms import gba
from algorithms.runtime import stragglers
from recjax.batch import Batch
from tests.runtime_util import assert_trees, reference, small_cfg, worker_batches

FREE = dict(bandwidth_gbps=float("inf"))


def cfg_gba(mode, steps=6, workers=4, local=16, dense=("sgd", 0.1), sparse=("sgd", 0.05),
            train=None, **kw):
    """Global batch 64 = M x B_a with M = 64 / local."""
    return small_cfg("gba", steps=steps, dense=dense, sparse=sparse, train=train, mode=mode,
                     workers=workers, local_batch_size=local, **{**FREE, **kw})


def global_batches(cfg, n):
    """The single trainer's batches of train.batch_size rows (the data-list order, uncut)."""
    return worker_batches(cfg, 0, 1, n)


def test_plan_derives_m_from_the_global_batch_and_refuses_bad_sizes():
    p = gba.plan(cfg_gba("gba", workers=0, local=16))
    assert (p.m, p.workers, p.local_batch, p.aggregate) == (4, 4, 16, 4)  # N_a = M (Sec. 4.1)
    assert gba.plan(cfg_gba("bsp", workers=3, local=16, b2=5)).aggregate == 5
    assert gba.plan(cfg_gba("hop_bw", workers=4, local=16, b3=1)).aggregate == 3
    with pytest.raises(ValueError, match="not a multiple"):
        gba.plan(cfg_gba("gba", local=24))
    with pytest.raises(ValueError, match="backup workers"):
        gba.plan(cfg_gba("hop_bw", workers=2, b3=2))


@pytest.mark.parametrize("dense", [("sgd", 0.1), pytest.param(("adam", 0.01), marks=pytest.mark.slow)])
def test_equal_speeds_m_equals_n_is_sync_on_the_global_batch(dense):
    """GBA, M = N_a = 4, B_a = 16: each global step averages the 4 gradients of one 64-row
    batch at the same params, i.e. the gradient of that batch's mean loss. With the embedding
    mean over the buffer (the mean loss's gradient) it is train_step on the 64-row batches."""
    steps = 6
    cfg = cfg_gba("gba", steps=steps, dense=dense, embedding_mean="buffer")
    got = gba.run(cfg)
    want = reference(cfg, global_batches(cfg, steps))
    assert got["steps"] == steps and got["dropped_gradients"] == 0
    assert got["dense_staleness"]["max"] == 0
    assert int(got["final_state"].step) == steps
    assert_trees(got["final_state"].params, want.params, rtol=1e-5, atol=1e-7)
    assert_trees(got["final_state"].tables, want.tables, rtol=1e-5, atol=1e-7)


@pytest.fixture(scope="module")
def sync_run():
    return gba.run(cfg_gba("sync"))


@pytest.mark.parametrize("mode,knob", [("bsp", {"b2": 4}), ("hop_bw", {"b3": 0}),
                                       ("hop_bs", {"b1": 0}), ("gba", {})])
def test_baselines_at_their_limits_run_the_sync_schedule(mode, knob, sync_run):
    """Equal speeds: BSP b2 = N, Hop-BW b3 = 0, Hop-BS b1 = 0 and GBA M = N are Sync."""
    sync = sync_run
    other = gba.run(cfg_gba(mode, **knob))
    assert other["updates"] == sync["updates"] == 6 and other["dropped_gradients"] == 0
    assert_trees(other["final_state"], sync["final_state"])  # bit for bit


def test_async_one_worker_equals_train_step():
    cfg = cfg_gba("async", steps=8, workers=1, local=64, dense=("adam", 0.01),
                  sparse=("adagrad", 0.05))
    got = gba.run(cfg)
    want = reference(cfg, global_batches(cfg, 8))
    assert got["updates"] == 8 and got["dense_staleness"]["max"] == 0
    assert_trees(got["final_state"].params, want.params, rtol=1e-4, atol=1e-7)
    assert_trees(got["final_state"].tables, want.tables, rtol=1e-4, atol=1e-7)


def gba_schedule(n, m, q, durations):
    """A GBA schedule by hand: the buffer of each global step.

    Workers take entries in request order (ties: first scheduled first) and pull the version
    k current at that moment; the PS applies when m gradients are buffered. `durations(w, j)`
    is worker w's time for its j-th batch. Returns, per global step k, the buffer's
    ``(entry i, version pulled)`` in entry order (entry i's token is i // m).
    """
    heap, seq = [], 0
    for w in range(n):
        heap.append((0.0, seq, w, "take"))
        seq += 1
    heapq.heapify(heap)
    nxt, k, buf, updates, done, held = 0, 0, [], [], [0] * n, {}
    while heap:
        t, _, w, what = heapq.heappop(heap)
        if what == "push":
            buf.append(held[w])
            if len(buf) == m:
                updates.append(sorted(buf))
                buf, k = [], k + 1
            heapq.heappush(heap, (t, seq, w, "take"))  # the next request: after same-time pushes
            seq += 1
        elif nxt < q:
            held[w] = (nxt, k)
            nxt += 1
            heapq.heappush(heap, (t + durations(w, done[w]), seq, w, "push"))
            done[w] += 1
            seq += 1
    return updates


def expected_gba_drops(n, m, q, iota, durations):
    """The data-list entries Eq. 1 drops (k - i // m > iota) on `gba_schedule`."""
    return [i for k, buf in enumerate(gba_schedule(n, m, q, durations))
            for i, _ in buf if k - i // m > iota]


@pytest.mark.parametrize("iota", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_iota_drops_exactly_the_stale_gradients(iota):
    n, m, steps, spec = 3, 3, 8, "slow:k=1,factor=3+lognormal:sigma=0.4"
    cfg = cfg_gba("gba", steps=steps, workers=n, local=20, iota=iota, stragglers=spec)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=m * 20))
    got = gba.run(cfg)
    model = stragglers.parse(spec, n, cfg.train.seed)
    cost = cfg.runtime.example_cost_us * 1e-6 * 20
    want = expected_gba_drops(n, m, steps * m, iota, lambda w, j: cost * model.factor(w, j))
    assert got["dropped_gradients"] == len(want) > 0
    assert got["gradients_applied"] == steps * m - len(want)
    assert got["updates"] == steps


@pytest.mark.parametrize("mode", ["gba", "hop_bw"] + [pytest.param(m, marks=pytest.mark.slow)
                                                      for m in ("sync", "async", "hop_bs", "bsp")])
def test_deterministic_mode_is_bit_reproducible(mode):
    kw = dict(steps=5, workers=4, stragglers="lognormal:sigma=0.5+slow:k=1,factor=3",
              bandwidth_gbps=10.0, b3=1, b2=3, b1=1)
    a, b = gba.run(cfg_gba(mode, **kw)), gba.run(cfg_gba(mode, **kw))
    assert_trees(a["final_state"], b["final_state"])
    assert a["schedule"].trace == b["schedule"].trace
    assert a["dense_staleness"] == b["dense_staleness"] and a["eval_ne"] == b["eval_ne"]


@pytest.mark.parametrize("mode", ["sync", pytest.param("hop_bs", marks=pytest.mark.slow)])
def test_waiting_workers_cost_no_events(mode):
    """A parked Wait is resumed once, when a write makes it true: every worker runs exactly
    1 + 2 x (its batches) + 1 events, however long it waits for the straggler (a busy wait on
    the virtual clock would add events in proportion to the waiting time)."""
    steps, n = 6, 4
    s = gba.run(cfg_gba(mode, steps=steps, workers=n, b1=1,
                        stragglers="slow:k=1,factor=20"))
    q = steps * 4
    assert s["tokens_handed_out"] == q
    assert s["schedule"].events == 2 * q + 2 * n


def test_counters_and_metrics_records(tmp_path):
    cfg = cfg_gba("gba", steps=6, stragglers="slow:k=1,factor=4", iota=1,
                  train={"out": str(tmp_path), "log_every": 2})
    s = gba.run(cfg)
    for key in ("global_qps", "local_qps", "dropped_gradients", "dense_staleness",
                "embedding_staleness", "tokens_handed_out", "hardware", "data_stats"):
        assert key in s
    assert s["tokens_handed_out"] == 6 * 4 and len(s["local_qps"]) == 4
    assert s["gradients_applied"] + s["dropped_gradients"] == 24
    assert s["global_qps"] == pytest.approx(sum(s["local_qps"]))
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    recs = [__import__("json").loads(x) for x in lines]
    kinds = [r["kind"] for r in recs]
    assert [r["step"] for r in recs if r["kind"] == "train"] == [2, 4, 6]  # every log_every
    assert "eval" in kinds
    counters = [r for r in recs if r["kind"] == "counters"]
    assert [r["step"] for r in counters] == [2, 4, 6]
    assert counters[-1]["dropped_gradients"] == s["dropped_gradients"]


def test_refuses_a_used_out_and_resumes_a_single_checkpoint(tmp_path):
    """The run contract: a fresh run refuses --out with checkpoints; --resume from a single
    run's checkpoint continues the global step (the hand-over of Sec. 4.1)."""
    from recjax.train import loop

    out = {"out": str(tmp_path)}
    single = small_cfg("single", steps=4, train=out)
    loop.run(single)
    with pytest.raises(ValueError, match="already holds checkpoints"):
        gba.run(cfg_gba("gba", steps=8, train=out))
    s = gba.run(cfg_gba("gba", steps=8, train={**out, "resume": True}))
    assert s["resumed_from_step"] == 4 and s["steps"] == 8 and s["updates"] == 4


def test_token_list_and_data_list_cover_the_single_trainers_batches():
    """M consecutive entries of B_a rows are exactly one global batch of the single trainer."""
    cfg = cfg_gba("sync", steps=3)
    rt_cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=16))
    small = worker_batches(rt_cfg, 0, 1, 12)
    big = global_batches(cfg, 3)
    for s in range(3):
        cat = Batch(*(np.concatenate([getattr(b, f) for b in small[4 * s:4 * s + 4]])
                      if getattr(big[s], f) is not None else None for f in Batch._fields))
        for f in ("dense", "ids", "label"):
            np.testing.assert_array_equal(getattr(cat, f), getattr(big[s], f))


def _train_losses(out):
    import json

    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in recs if r["kind"] == "train"}


@pytest.mark.slow
def test_sync_to_gba_to_sync_through_one_out(tmp_path):
    """The hand-over of Sec. 4.1 through one --out: sync (SPMD, 2 devices) for 30 global
    steps, GBA (4 workers, B_a = 16, a 3x straggler, iota = 2) for 15, sync again for 15, with
    unchanged hyperparameters (Adam 0.01 dense, Adagrad rows, global batch 64).

    Measure: each step's loss is that global batch's mean log loss, scored at the params it
    trained from. The loss still falls, so the 10 steps before a switch are fitted with a line;
    the mean loss of the 6 steps after the switch must lie within 3 per-step residual standard
    deviations of that line's extrapolation. The global step and the optimizer states continue
    (the step count is exact, the Adam count equals the updates applied)."""
    out = {"out": str(tmp_path), "log_every": 1}
    hp = dict(dense=("adam", 0.01), sparse=("adagrad", 0.05))
    sync = small_cfg("sync", steps=30, train={**out, "devices": 2}, **hp)
    from algorithms import sync as sync_algo

    sync_algo.run(sync)
    g = gba.run(cfg_gba("gba", steps=45, train={**out, "resume": True}, iota=2,
                        stragglers="slow:k=1,factor=3", bandwidth_gbps=10.0, **hp))
    assert g["resumed_from_step"] == 30 and g["steps"] == 45 and g["updates"] == 15
    back = sync_algo.run(small_cfg("sync", steps=60, train={**out, "devices": 2, "resume": True},
                                   **hp))
    assert back["resumed_from_step"] == 45 and back["steps"] == 60
    adam_count = [x for x in __import__("jax").tree.leaves(back["final_state"].opt_state)
                  if np.ndim(x) == 0]
    assert int(adam_count[0]) == 60  # 30 sync + 15 GBA updates (none dropped whole) + 15 sync
    loss = _train_losses(tmp_path)
    assert sorted(loss) == list(range(1, 61))
    for switch in (30, 45):
        xb = np.arange(switch - 9, switch + 1)
        before = np.array([loss[s] for s in xb])
        slope, icept = np.polyfit(xb, before, 1)
        sigma = (before - (slope * xb + icept)).std(ddof=2)
        xa = np.arange(switch + 1, switch + 7)
        after = np.array([loss[s] for s in xa])
        drift = after.mean() - (slope * xa + icept).mean()
        print(f"switch at step {switch}: drift {drift:+.4f}, residual sd {sigma:.4f}")
        assert abs(drift) <= 3 * sigma, (switch, drift, sigma, before, after)


@contextlib.contextmanager
def _server(cfg):
    """A `GbaServer` on its own `Runtime` for `cfg`, and one batch's gradients at its params:
    ``(rt, server, rows, dense grads, row sums)``; the runtime is closed afterwards."""
    from algorithms.runtime import Runtime

    p = gba.plan(cfg)
    rt = Runtime(cfg, p.workers, batch_size=p.local_batch)
    try:
        server = gba.GbaServer(rt, p, rt.init_state.params, rt.init_state.opt_state)
        local, rows = rt.warm_batch
        _, g, sums = rt.grads_rows(server.params, rt.ps.pull(rows), local)
        yield rt, server, rows, g, sums
    finally:
        rt.close()


def test_rows_dropped_by_their_last_update_leave_the_tables_alone():
    """App. B's per-id rule (embedding_staleness=id): a row updated at global step 5 is stale
    for a batch with token 0 when iota = 0, whatever k is; a table whose rows are all dropped
    gets no update (and no crash on the empty aggregate)."""
    with _server(cfg_gba("gba", steps=1, iota=0)) as (rt, server, rows, g, sums):
        before = rt.ps.snapshot()[0]
        for name, (ids, n) in rows.items():
            server.tag.set(name, ids[:n], 5)
        server._apply_rows(gba.aggregation(server.rule, server.gc, server.version,
                                           [gba.Grad(0, 0, 0, 0, g, rows, sums)] * 2, 0))
        assert server.stats.dropped_rows == 2 * sum(n for _, n in rows.values())
        np.testing.assert_equal(rt.ps.snapshot()[0], before)


@pytest.mark.parametrize("mode,after", [("sync", 3), ("hop_bw", 3), ("hop_bs", 3), ("gba", 4),
                                        ("bsp", 4)])
def test_a_lost_worker_lowers_the_aggregate_of_the_modes_that_wait_for_all(mode, after):
    """`GbaServer.lose` (a worker's process died under --backend ray): sync, hop_bw and hop_bs
    wait for all N workers, so they aggregate N - 1 from then on and a buffer already holding
    N - 1 gradients is applied at once; gba (M entries) and bsp (b2) do not depend on N."""
    cfg = cfg_gba(mode, steps=2, workers=4, local=16, b2=4, b3=0)
    with _server(cfg) as (_, server, rows, g, sums):
        for w in range(3):
            _, version = server.pull(w)
            server.push(gba.Grad(w, w, 0, version, g, rows, sums))
        assert server.stats.updates == 0
        # sync and hop_bw: the three who pushed wait for k = 1, which needs worker 3's gradient
        assert server.may_start(0) == (mode not in ("sync", "hop_bw"))
        server.lose(3)
        assert server.aggregate == after and server.lost == [3] and 3 not in server.active
        assert server.stats.updates == (1 if after == 3 else 0)
        assert server.may_start(0)  # nobody waits for the lost worker


def test_every_mode_is_a_row_of_the_rule_table():
    from recjax.config_async import GBA_MODES

    assert tuple(gba.MODES) == GBA_MODES
    # GBA's own rules (Eq. 1) belong to gba alone; the others are Sec. 3.1 / 5.1's baselines
    assert [m for m, r in gba.MODES.items() if r.drops == "stale"] == ["gba"]
    # each row says where the paper defines it; a misspelt rule fails when the table is built
    assert all(r.paper.startswith("Sec.") for r in gba.MODES.values())
    with pytest.raises(ValueError, match="waits_for='per_step'"):
        gba.ModeRule("per_step", lambda m, n, gc: n)


def _update_of(staleness, tagged_at=4):
    """One update at k = 5, iota = 1, of 4 gradients of one batch scaled 1, 2, 3, 4 with tokens
    5, 5, 5, 2 (the last one's dense part is Eq. 1-stale: 5 - 2 > 1); the first half of each
    table's ids last updated at step `tagged_at`. Returns (row deltas, ids, half, stats)."""
    cfg = cfg_gba("gba", steps=1, iota=1, embedding_staleness=staleness)
    with _server(cfg) as (rt, server, rows, g, sums):
        half = {name: n // 2 for name, (_, n) in rows.items()}
        for name, (ids, _) in rows.items():
            server.tag.set(name, ids[:half[name]], tagged_at)
        before = rt.ps.snapshot()[0]
        server.version = 5
        server._apply(gba.aggregation(server.rule, server.gc, 5, [
            gba.Grad(i, i, t, 4, g, rows, {k: np.asarray(v) * np.float32(i + 1)
                                           for k, v in sums.items()})
            for i, t in enumerate((5, 5, 5, 2))], 0))
        after = rt.ps.snapshot()[0]
        deltas = {k: np.asarray(after[k]) - np.asarray(before[k]) for k in after}
        return deltas, rows, half, server.stats


def test_the_per_id_rule_judges_rows_apart_from_the_dense_part():
    """Issue 35's bug (App. B Alg. 2 l. 20-21): the dense part of the 4th gradient is dropped
    by Eq. 1 (k - t = 3 > iota = 1), but its rows are judged by their id's tag: the ids never
    updated (tag -1: -1 - 2 <= 1) keep its rows, (1 + 2 + 3 + 4) / 4 = 2.5 x the gradient;
    the ids updated at step 4 (4 - 2 > 1) drop them. A dropped row's gradient still met the id,
    so it counts in the divisor (l. 23, as l. 22 divides by N_a): (1 + 2 + 3) / 4 = 1.5 x. The
    token rule drops the 4th gradient's rows with its dense part: 1.5 x everywhere.
    Plain SGD on the rows, so a row's change is -lr x its mean gradient."""
    by_id, rows, half, s_id = _update_of("id")
    by_token, _, _, s_tok = _update_of("token")
    assert s_id.dropped == s_tok.dropped == 1  # the dense part: Eq. 1 in both
    assert s_tok.dropped_rows == 0 and s_id.dropped_rows == sum(half.values())
    for name, (ids, n) in rows.items():
        a, b = by_id[name], by_token[name]
        fresh, stale = ids[half[name]:n], ids[:half[name]]
        # a delta is a difference of float32 table values of up to ~0.1: it carries their
        # rounding (ulp 7e-9), so the absolute tolerance is a few of those
        np.testing.assert_allclose(a[stale], b[stale], rtol=1e-5, atol=3e-8)
        np.testing.assert_allclose(a[fresh], 2.5 / 1.5 * b[fresh], rtol=1e-5, atol=3e-8)
        # the rules differ by 40% of a fresh row's change: far above that tolerance
        assert np.abs(a[fresh] - b[fresh]).max() > 100 * 3e-8
        assert np.abs(b[fresh]).max() > 0


# The schedule of the test below, by hand: 3 workers, M = 3, B_a = 20, iota = 0; workers 0 and
# 2 take 1 time unit per batch, worker 1 (the straggler) 2.7 (no instant where it and another
# worker both push, so the order of events needs no tie rule beyond "pushes before takes").
# "w0 5@1": worker 0 takes entry 5 (token 5 // 3 = 1) at version 1.
#   t=0    w0 0@0, w1 1@0, w2 2@0
#   t=1    push 0, 2; w0 3@0, w2 4@0
#   t=2    push 3: k=0 applies {0, 2, 3}; push 4; w0 5@1, w2 6@1
#   t=2.7  push 1; w1 7@1
#   t=3    push 5: k=1 applies {1, 4, 5}, entry 1 (token 0) Eq. 1-stale: 1 - 0 > 0; push 6;
#          w0 8@2, w2 9@2
#   t=4    push 8, 9: k=2 applies {6, 8, 9}; w0 10@3, w2 11@3
#   t=5    push 10, 11; w0 12@3, w2 13@3
#   t=5.4  push 7: k=3 applies {7, 10, 11}, entry 7 (token 2) stale: 3 - 2 > 0; w1 14@4
#   t=6    push 12, 13; w0 15@4, w2 16@4
#   t=7    push 15: k=4 applies {12, 13, 15}; push 16; w0 17@5, w2 18@5
#   t=8    push 17, 18: k=5 applies {16, 17, 18}; w0 19@6, w2 20@6
#   t=8.1  push 14; w1 21@6
#   t=9    push 19, 20: k=6 applies {14, 19, 20}, entry 14 (token 4) stale: 6 - 4 > 0;
#          w0 22@7, w2 23@7
#   t=10   push 22, 23; the data list is empty
#   t=10.8 push 21: k=7 applies {21, 22, 23}
ID_RULE_SCHEDULE = [[(0, 0), (2, 0), (3, 0)], [(1, 0), (4, 0), (5, 1)], [(6, 1), (8, 2), (9, 2)],
                    [(7, 1), (10, 3), (11, 3)], [(12, 3), (13, 3), (15, 4)],
                    [(16, 4), (17, 5), (18, 5)], [(14, 4), (19, 6), (20, 6)],
                    [(21, 6), (22, 7), (23, 7)]]


def expected_row_counters(schedule, m, iota, batch_ids, per_id):
    """App. B Alg. 2 l. 19-21 in plain Python over `schedule` (`gba_schedule`'s form).

    Every id carries a tag, the global step after its last update (-1: never updated). In
    update k a row of id u in the gradient of entry i (token t = i // m, pulled at version v)
    is applied when ``tag(u) - t <= iota`` (``per_id``) or when its gradient is
    (``k - t <= iota``, the token rule); an applied row's staleness is ``max(tag(u) - v, 0)``;
    after the update every id with an applied row is tagged k + 1.

    Args:
      batch_ids: per entry, ``{table: its batch's unique ids}``.
    Returns:
      the summary's counters, and ``rescued`` (rows of Eq. 1-dropped gradients that the id
      rule applies) and ``reverse`` (rows of Eq. 1-kept gradients it drops).
    """
    tag, stale = {}, collections.Counter()
    c = dict(dropped_gradients=0, dropped_embedding_rows=0, rescued=0, reverse=0)
    for k, buf in enumerate(schedule):
        updated = set()
        for i, v in buf:
            t = i // m
            eq1 = k - t <= iota
            c["dropped_gradients"] += not eq1
            for table, ids in batch_ids[i].items():
                for u in ids:
                    by_id = tag.get((table, u), -1) - t <= iota
                    c["rescued"] += by_id and not eq1
                    c["reverse"] += eq1 and not by_id
                    c["dropped_embedding_rows"] += per_id and not by_id
                    if (by_id if per_id else eq1):
                        stale[max(tag.get((table, u), -1) - v, 0)] += 1
                        updated.add((table, u))
        tag.update(dict.fromkeys(updated, k + 1))
    c["gradients_applied"] = m * len(schedule) - c["dropped_gradients"]
    c["tagged_ids"] = len(tag)
    c["embedding_staleness"] = {str(s): n for s, n in sorted(stale.items())}
    return c


def test_the_id_rule_keeps_rows_the_token_rule_drops(tmp_path):
    """Issue 35: on the hand-written schedule above, Eq. 1 drops the dense parts of entries 1,
    7 and 14; the id rule (App. B Alg. 2 l. 21) applies those of their rows whose id was not
    updated since the token (tag - t <= 0), which the token rule drops with the dense part. The
    reverse cannot happen (a tag is at most k, a kept gradient has t >= k - iota). The
    summaries' counters are those of `expected_row_counters` on the batches' own ids."""
    n, m, local, steps, iota, spec = 3, 3, 20, 8, 0, "slow:k=1,factor=2.7"
    cfg = cfg_gba("gba", steps=steps, workers=n, local=local, iota=iota, stragglers=spec)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=m * local))
    model = stragglers.parse(spec, n, cfg.train.seed)
    assert [model.factor(w, j) for w in range(n) for j in range(5)] == [1] * 5 + [2.7] * 5 + [1] * 5
    cost = cfg.runtime.example_cost_us * 1e-6 * local
    assert gba_schedule(n, m, steps * m, lambda w, j: cost * model.factor(w, j)) == ID_RULE_SCHEDULE
    entries = worker_batches(dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, batch_size=local)), 0, 1, steps * m)
    # DLRM smoke: table j is field j's (ids of shape [B_a, fields, 1])
    batch_ids = [{j: np.unique(b.ids[:, j]).tolist() for j in range(b.ids.shape[1])}
                 for b in entries]
    got = {}
    for rule in ("id", "token"):
        c = dataclasses.replace(cfg, gba=dataclasses.replace(cfg.gba, embedding_staleness=rule),
                                train=dataclasses.replace(cfg.train, out=str(tmp_path / rule)))
        got[rule] = gba.run(c)["final_state"]
        summary = json.loads((tmp_path / rule / "summary.json").read_text())
        want = expected_row_counters(ID_RULE_SCHEDULE, m, iota, batch_ids, rule == "id")
        assert want["dropped_gradients"] == 3 and want["rescued"] > 0 and want["reverse"] == 0
        assert summary["updates"] == steps
        for key in ("dropped_gradients", "gradients_applied", "dropped_embedding_rows",
                    "tagged_ids"):
            assert summary[key] == want[key], (rule, key)
        assert summary["embedding_staleness"]["histogram"] == want["embedding_staleness"], rule
    applied = {r: sum(expected_row_counters(ID_RULE_SCHEDULE, m, iota, batch_ids, r == "id")
                      ["embedding_staleness"].values()) for r in ("id", "token")}
    assert applied["id"] - applied["token"] == want["rescued"]  # the rows id keeps, token drops
    tables = [jax.tree.leaves(got[r].tables) for r in ("id", "token")]
    assert len(tables[0]) == 4 and any(not np.array_equal(a, b) for a, b in zip(*tables))


@pytest.mark.parametrize("staleness", ["id", "token"])
def test_row_updates_of_tables_of_two_widths_are_each_ids_f_weighted_mean(staleness):
    """DeepFM (``wide`` tables of width 1 beside ``emb`` tables of width D, aggregated together
    per width): under sparse SGD (lr 0.05) each (table, id)'s row moves by -lr x the sum of its
    rows with f = 1 over the gradients that touched it, divided by how many touched it
    (App. B Alg. 2 l. 21-23, ``embedding_mean=touched``), computed here per table in plain
    numpy from the gradients pushed. Four gradients of two batches (ids shared across tables
    and batches), scaled 1-4, tokens 5, 5, 2, 5 at k = 5, iota = 1, the first half of each
    table's ids of batch A tagged 4; a table's ids start at the last id of the table before
    it. Kills rows of two tables of one width summed or counted together, a
    gradient's rows attributed to another, and an id's mean over the wrong count."""
    cfg = cfg_gba("gba", steps=1, iota=1, embedding_staleness=staleness)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, name="deepfm"))
    with _server(cfg) as (rt, server, rows, g, _):
        assert len({t.embedding_dim for t in rt.model.layout.tables}) == 2
        local, _ = rt.warm_batch
        # each table's ids a run that starts at the last id of the table before it (of its
        # width), so that sorted (table, id) pairs meet an equal id across tables; batch B
        # holds them in reverse order
        rows_a, rows_b, base = {}, {}, {}
        for t in rt.model.layout.tables:
            ids, n = rows[t.name]
            start = base.get(t.embedding_dim, t.num_embeddings - n)
            assert start + n <= t.num_embeddings
            rows_a[t.name] = (np.r_[np.arange(start, start + n), ids[n:]], n)
            rows_b[t.name] = (np.r_[np.arange(start + n - 1, start - 1, -1), ids[n:]], n)
            base[t.embedding_dim] = start + n - 1
        sums_a, sums_b = (rt.grads_rows(server.params, rt.ps.pull(r), local)[2]
                          for r in (rows_a, rows_b))
        half = {name: n // 2 for name, (_, n) in rows_a.items()}
        for name, (ids, _) in rows_a.items():
            server.tag.set(name, ids[:half[name]], 4)
        tags = {name: np.full(t.num_embeddings, -1) for t in rt.model.layout.tables
                for name in [t.name]}
        for name, (ids, _) in rows_a.items():
            tags[name][ids[:half[name]]] = 4
        grads = [gba.Grad(i, i, t, 4, g, rows, {k: np.asarray(v) * np.float32(i + 1)
                                                for k, v in sums.items()})
                 for i, (t, rows, sums) in enumerate([(5, rows_a, sums_a), (5, rows_b, sums_b),
                                                      (2, rows_a, sums_a), (5, rows_b, sums_b)])]
        before = rt.ps.snapshot()[0]
        server.version = 5
        u = gba.aggregation(server.rule, server.gc, 5, grads, 0)
        server._apply_rows(u)
        after = rt.ps.snapshot()[0]
        for t in rt.model.layout.tables:
            total = np.zeros_like(np.asarray(before[t.name]))
            met = np.zeros(t.num_embeddings, np.int64)
            for e, keep in zip(grads, u.keep):
                ids, n = e.rows[t.name]
                for r in range(n):
                    f = (tags[t.name][ids[r]] - e.token <= 1) if staleness == "id" else keep
                    met[ids[r]] += 1
                    total[ids[r]] += np.asarray(e.sums[t.name])[r] * f
            want = np.asarray(before[t.name]) - 0.05 * total / np.maximum(met, 1)[:, None]
            np.testing.assert_allclose(np.asarray(after[t.name]), want, rtol=1e-5, atol=1e-7,
                                       err_msg=t.name)
