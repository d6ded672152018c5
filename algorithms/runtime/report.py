"""What a host-async run shows while it runs: the single trainer's outputs, from the roles.

`recjax.train.loop` reports a run as it goes (progress bar, ``kind: train`` records every
``train.log_every`` steps with the loss, the window's and the whole run's Train NE and the rate,
``kind: eval`` records every ``train.eval_every`` steps, TensorBoard mirrors of both, early
stopping) through `recjax.train.hooks.RunOutputs`. A `Reporter` gives the host-async engine
(``engine.py``) the same outputs through the same `RunOutputs`, plus ``kind: counters``
records of the algorithm's own counters (staleness, sync gap, bytes, dropped gradients) at
every train record, so that a run that goes wrong shows *when* (issue 15). What is its own is
when it looks at the roles and how it reads a consistent state there.

When it looks:

* virtual clock (``--deterministic``): after every event (`clock.run_virtual`'s ``on_event``),
  when every role is suspended at a yield. Records and evals land exactly on the multiples of
  ``log_every`` / ``eval_every`` that the global step reaches, evaluation takes no virtual
  time, and nothing the roles read is written, so a run with evals is bit-identical to one
  without (tests/test_reporting.py).
* threads: every poll of the main thread (`ThreadGroup.wait`, 50 ms). Each role runs through a
  gate (`Reporter.wrap`): before a record or an eval the main thread closes the gate and waits
  until no role is between two yields, so what it reads (dense params and PS tables together)
  is one consistent state; the paused time is taken out of the throughput. A record lands on
  the first step the poll sees at or past the multiple. Under Ray the poll reads the step
  once a ``ray.chunk_s`` (`placement.step_poll_s`; GBA's step is a call to PS0's actor).

The Train NE of a record is ShadowSync Eq. 2 over every batch scored so far (each batch scored
before its update, Sec. 4), the same sums summary.json's ``train_ne`` is built from: the last
record, written by `Reporter.final`, equals it.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from typing import Any

from algorithms.runtime.finish import predictor, pulls, save_best, state_at, totals
from recjax.runlog import flat_scalars
from recjax.train import contract
from recjax.train.hooks import RunOutputs
from recjax.train.step import StepMetrics

_PROGRESS_S = 1.0  # threads: a ``kind: progress`` record (iterations so far) this often


class Reporter:
    """The progress bar, metrics.jsonl / TensorBoard records and mid-run evals of one segment.

    Args:
      rt: the run's `engine.Runtime` (config, data, PS, progress carried across segments).
      workers: the `worker.Worker`\\ s, whose ``counters.metrics`` hold every scored batch.
      step: ``() -> global step reached`` (cheap: called after every virtual event); default
        the start step plus the workers' iterations (one global step each).
      snapshot: ``() -> (dense params, opt state, global step)`` of the model to evaluate
        (None: no mid-run evals).
      counters: ``() -> dict`` of the algorithm's counters so far (nested dicts are flattened).
      served: ``() -> [bytes PS shard s served]`` so far; default the workers' counters (Persia's
        embedding workers, not its NN workers, reach the PS: it counts them itself).
    """

    def __init__(self, rt: Any, workers: list, step: Callable[[], int] | None = None,
                 snapshot: Callable[[], tuple] | None = None,
                 counters: Callable[[], dict] | None = None,
                 served: Callable[[], list[int]] | None = None):
        cfg, tc = rt.cfg, rt.cfg.train
        self.rt, self.workers, self.tc = rt, list(workers), tc
        self.step = step or (lambda: rt.start_step + sum(w.counters.iterations for w in self.workers))
        self.served = served or (lambda: [sum(w.counters.shard_bytes[s] for w in self.workers)
                                          for s in range(rt.ps.num_shards)])
        self.snapshot, self.counters = snapshot, counters or dict
        self.on_wait: Callable[[], None] = lambda: None  # called while roles are being held
        self.virtual = bool(tc.deterministic)
        # the bar, records, their cadence and the early stopper (its state from the checkpoint
        # the run, or this interval, starts from), as the single/SPMD loop has them
        self.out = out = RunOutputs(cfg, rt.start_step, rt.total_steps, rt.ckpt is not None,
                                    rt.progress.early_stop, rt.resuming,
                                    f"{tc.algo} {cfg.model.name} on {cfg.data.train}",
                                    self.virtual)
        self.writer, self.bar, self.stopper = out.writer, out.bar, out.stopper
        self.seen = [0] * len(self.workers)  # metrics of each worker already in a record
        self.segment = dict.fromkeys(StepMetrics._fields, 0.0)  # sums recorded this segment
        self.last_step, self.last_t = rt.start_step, 0.0
        self.t_start = time.perf_counter()
        self.paused = 0.0  # threads: seconds the roles were held for records and evals
        self._t_progress = self.t_start
        self._seen_step = rt.start_step
        self._polled = (float("-inf"), rt.start_step)  # threads: the poll's last step read
        # the gate (threads): roles between two yields, and whether the main thread holds them
        self._cond = threading.Condition()
        self._active = 0
        self._hold = False
        self._stop: threading.Event | None = None
        self.early: tuple | None = None  # (TrainState, eval, predictions) where the run stopped

    def start(self) -> float:
        """Threads: the roles start now. The records' rates are over training seconds from
        here, the origin of the interval's `Schedule.seconds` (which `final` and `boundary` are
        given): an origin at the reporter's making counted the set-up (compiles, Ray actors)
        into the first record and none of it into the last, whose rate then read 1e15
        examples/s after a set-up longer than the interval's last record window. Returns that
        origin, for `run_threaded` to count `Schedule.seconds` from: two readings of the clock
        ~1 ms apart under load made the windows' sum miss the summary's seconds."""
        self.t_start = self._t_progress = time.perf_counter()
        return self.t_start

    # -- the two interpreters' hooks ---------------------------------------------------------
    def on_event(self, now: float) -> bool:
        """Virtual clock: called after every event, with the virtual time; True ends the run
        there (early stopping)."""
        s = self.step()
        if s == self._seen_step:
            return False
        self._seen_step = s
        self.out.progress(s)
        self._due(s, now)
        return self.early is not None

    def on_poll(self) -> None:
        """Threads: called by the main thread every poll interval."""
        if self.early is not None:  # stopped early: the roles are ending, nothing to record
            return
        now = time.perf_counter()
        if now - self._t_progress >= _PROGRESS_S:
            self._t_progress = now
            self.writer.write({"kind": "progress", "wall": now - self.rt.t0,
                               "iterations": sum(w.counters.iterations for w in self.workers)})
        s = self._poll_step(now)
        self.out.progress(s)
        if self._hold or self._log_due(s) or self._eval_due(s):
            self._hold_roles()
            try:
                # the step and the training seconds where the roles are held
                self._due(self.step(), self._seconds(self._held_at))
                if self.early is not None and self._stop is not None:
                    self._stop.set()  # early stopping: the roles end where they are held
            finally:
                self._release_roles()

    def _poll_step(self, now: float) -> int:
        """The step as the poll sees it: read again once `placement.step_poll_s` passed."""
        t, s = self._polled
        if now - t >= self.rt.placement.step_poll_s:
            s = self.step()
            self._polled = (now, s)
        return s

    def _seconds(self, at: float) -> float:
        """Training seconds of this segment until `at` (`time.perf_counter`; threads: without
        the held time)."""
        return at - self.t_start - self.paused

    def _log_due(self, s: int) -> bool:
        return self.out.logs.due(s, self.rt.total_steps)

    def _eval_due(self, s: int) -> bool:
        return self.snapshot is not None and self.out.evals.due(s, self.rt.total_steps)

    def _due(self, s: int, t: float) -> None:
        # the run's last step is recorded by `final`, from the sums summary.json is built from
        if self._log_due(s):
            self._record(s, t, self._window())
            self.out.logs.done(s)
        if self._eval_due(s):
            self._evaluate()
            self.out.evals.done(s)

    # -- records -----------------------------------------------------------------------------
    def _window(self, final: bool = False) -> list:
        """The scored batches of the iterations completed since the last record, worker by
        worker (a worker scores a batch before its iteration completes: the batches in flight
        go into the next record); `final`: every batch scored."""
        ms = []
        for i, w in enumerate(self.workers):
            got = w.counters.metrics
            n = len(got) if final else min(w.counters.iterations, len(got))
            ms.extend(got[self.seen[i]:n])
            self.seen[i] = max(n, self.seen[i])
        return ms

    def _record(self, s: int, t: float, ms: list, run_totals: dict | None = None,
                extra: dict | None = None) -> None:
        """A ``train`` record at step `s` (then a ``counters`` record) from the batches `ms`."""
        rt, tc = self.rt, self.tc
        w = None
        if ms:
            w = contract.sum_metrics(ms, mean_loss=True)
            contract.check_finite(w, f"in steps {self.last_step + 1}-{s}", rt.ckpt)
            for k in StepMetrics._fields:
                self.segment[k] += w[k]
        if run_totals is None:
            run_totals = {k: rt.progress.totals[k] + self.segment[k] for k in StepMetrics._fields}
        self.out.train_record(
            s, rt.steps_per_epoch, w, run_totals,
            (s - self.last_step) * tc.batch_size / max(t - self.last_t, 1e-12),
            rt.progress.wall_seconds + time.perf_counter() - rt.t0,
            **({"virtual_seconds": t} if self.virtual else {}))
        self.out.counters_record(s, self._counters(extra))
        self.last_step, self.last_t = s, t

    def _counters(self, extra: dict | None = None) -> dict:
        """The engine's counters every algorithm has, then the algorithm's own (`extra`, or
        the live ones)."""
        ws = self.workers
        return {"worker_iterations": sum(w.counters.iterations for w in ws),
                "embedding_bytes": int(sum(self.served())),
                **(self.counters() if extra is None else extra)}

    def _evaluate(self) -> None:
        """Evaluate the model as it is now (dense params and PS tables of one moment); with
        early stopping or keep_best, track it (`track`)."""
        rt = self.rt
        params, opt_state, s = self.snapshot()
        s = int(s)
        state = state_at(rt, params, opt_state, s) if self.stopper is not None else None
        tables = None if pulls(rt) else (state.tables if state is not None
                                         else rt.ps.snapshot()[0])
        ev, preds = contract.evaluate(rt.cfg, rt.data, predictor(rt), params, tables)
        self.out.eval_record(s, ev)
        if self.track(s, ev, state):
            self.early = (state, ev, preds)

    def track(self, step: int, ev: dict, state, progress=None, final: bool = False) -> bool:
        """Hand an eval to the early stopper (`RunOutputs.track`): an improving one writes
        `state` (a `TrainState` at `step`) to out/best/ with `progress` (default: the run's so
        far plus the batches of this call's completed iterations); True when the run is to stop
        here (the stopper's patience ran out; never at the run's `final` eval)."""
        if self.stopper is None:
            return False

        def save(ckpt) -> None:
            p = progress
            if p is None:  # mid-call: rt.progress has not taken this call's sums yet
                p = copy.deepcopy(self.rt.progress)
                if step > self.rt.start_step and self.workers:
                    p.add(totals(self.workers, completed=True))
            save_best(self.rt, ckpt, state, p, time.perf_counter() - self.rt.t0)

        return self.out.track(step, ev, save, final)

    def final(self, step: int, seconds: float, ev: dict | None, extra: dict) -> None:
        """The segment's last records: train (the Train NE of summary.json), counters, eval
        (None: the eval that stopped the run early, already written); the algorithm's counters
        on screen. Call after ``rt.progress`` took the segment's sums."""
        self.out.progress(step)
        self.bar.close()
        self._record(step, seconds, self._window(final=self.early is None),
                     run_totals=self.rt.progress.totals, extra=extra)
        if ev is not None:
            self.out.eval_record(step, ev)
        self.close()
        if not self.tc.progress:
            return
        shown = {k: v for k, v in flat_scalars(extra).items() if ".histogram." not in k}
        if shown:
            per = " (rates per virtual second)" if self.virtual else ""
            print(f"{self.tc.algo} counters{per}:")
            for k, v in shown.items():
                print(f"  {k:>36}  {v:.6g}" if isinstance(v, float) else f"  {k:>36}  {v}")

    def boundary(self, step: int, seconds: float, ev: dict | None, extra: dict) -> None:
        """The records of a checkpoint interval's end (``intervals.py``): train and counters
        over the batches since the last record (the next interval's roles start afresh, so its
        window would miss them), and the eval made there, if one was due."""
        self.out.progress(step)
        self._record(step, seconds, self._window(final=True), run_totals=self.rt.progress.totals,
                     extra=extra)
        if ev is not None:
            self.out.eval_record(step, ev)
        self.close()

    def close(self) -> None:
        self.out.close()

    # -- the gate (threads) ------------------------------------------------------------------
    def bind(self, stop: threading.Event) -> None:
        """The run's stop flag: a held or holding thread gives up when it is set."""
        self._stop = stop

    def wrap(self, role):
        """`role` behind the gate: it runs between two yields only while the gate is open."""
        value = None
        try:
            while True:
                if not self._enter():  # the run is stopping: no more of this role's code
                    return
                try:
                    effect = role.send(value)
                except StopIteration:
                    return
                finally:
                    self._leave()
                value = yield effect
        finally:
            role.close()

    def _stopping(self) -> bool:
        return self._stop is not None and self._stop.is_set()

    def _enter(self) -> bool:
        """Wait while the gate is closed; False if the run stops meanwhile."""
        with self._cond:
            if self._stopping():  # e.g. early stopping: not one more step after the eval
                return False
            if not self._hold:  # a record is due: stop here until the main thread took it
                s = self.step()
                self._hold = self._log_due(s) or self._eval_due(s)
            while self._hold and not self._stopping():
                self._cond.wait(0.05)
            if self._hold or self._stopping():
                return False
            self._active += 1
            return True

    def _leave(self) -> None:
        with self._cond:
            self._active -= 1
            self._cond.notify_all()

    def _hold_roles(self) -> None:
        """Hold the roles at their next yield. The held (paused) time counts from when the
        last of them got there: until then some role trains. A record's seconds are read at
        that instant too, so none of them passes the interval's `Schedule.seconds` less
        `paused` (a record's clock read later, while its paused time was not yet counted,
        could: the last window was then 1e-12 s, CI stop 52)."""
        with self._cond:
            self._hold = True
            while self._active and not self._stopping():
                self.on_wait()  # the engine's watchdog: a stuck role never goes idle
                self._cond.wait(0.05)
            self._held_at = time.perf_counter()

    def _release_roles(self) -> None:
        with self._cond:
            self._hold = False
            self._cond.notify_all()
        self.paused += time.perf_counter() - self._held_at


def histogram_summary(hist: dict[int, int]) -> dict:
    """``{mean, max, histogram}`` of a count histogram (staleness counters of summaries)."""
    n = sum(hist.values())
    return {"mean": sum(k * v for k, v in hist.items()) / n if n else None,
            "max": max((k for k, v in hist.items() if v), default=None),
            "histogram": {str(k): int(v) for k, v in sorted(hist.items()) if v}}
