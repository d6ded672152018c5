"""What every trainer shows and keeps while it runs: one set of outputs for both run drivers.

The single/SPMD step loop (`recjax.train.loop.run`) and the host-async engine's reporter
(``algorithms/runtime/report.py``, fed by the virtual clock's events or the threads' polls)
each reach a global step, and at it hand this module what they measured; `RunOutputs` then
does, the same way for every algorithm:

* the progress bar (its postfix: loss, the run's Train NE, the rate);
* ``kind: train`` records every ``train.log_every`` steps (`train_record`: the window's loss and
  Train NE, the whole run's Train NE, ShadowSync Eq. 2, the rate, the wall time), ``kind:
  eval`` and ``kind: counters`` records, and their TensorBoard mirrors (`recjax.runlog`);
* the cadence of records and evals (`Cadence`: the multiples of ``log_every`` /
  ``eval_every`` a run reaches; a driver that may pass a multiple between two looks, the
  threads, records at the first step past it);
* early stopping and the best checkpoint (`track`: `EarlyStopper` over the evals, out/best/
  written through the driver's ``save``).

What stays with each driver is what differs in kind: how a step is taken, how a consistent
state is read for an eval (the threads' gate), checkpoints, signals and the summary.
"""

from __future__ import annotations

from collections.abc import Callable

from tqdm.auto import tqdm

from recjax.config import Config
from recjax.runlog import MetricsWriter, flat_scalars
from recjax.train import contract
from recjax.train.early_stop import EarlyStopper


def rate_key(virtual: bool) -> str:
    """The name of a throughput: a modelled rate on the virtual clock is not a measured one."""
    return "examples_per_virtual_sec" if virtual else "examples_per_sec"


class Cadence:
    """The steps at which something recurs every `every` steps after `start` (0: never)."""

    def __init__(self, every: int, start: int):
        self.every = every
        self.next = self._after(start) if every else None

    def _after(self, step: int) -> int:
        return (step // self.every + 1) * self.every

    def due(self, step: int, end: int) -> bool:
        """Whether a multiple was reached at or before `step`, short of the run's `end` (the
        last step has its own record)."""
        return self.next is not None and self.next <= step < end

    def done(self, step: int) -> None:
        """It happened at `step`: the next one is the multiple after it."""
        if self.next is not None:
            self.next = self._after(step)


class RunOutputs:
    """The progress bar, metrics.jsonl / TensorBoard records, cadence and early stopper of one
    call of a trainer.

    Args:
      cfg: the run's config.
      start_step, total_steps: where this call starts and where the run ends.
      checkpoints: the run writes checkpoints (the best checkpoint needs them).
      early_state: `EarlyStopper.state` of the checkpoint the call starts from (None: fresh).
      append: append to the run's metrics.jsonl (a resumed run).
      desc: the progress bar's label.
      virtual: the rates are per virtual second (`rate_key`).
    """

    def __init__(self, cfg: Config, start_step: int, total_steps: int, checkpoints: bool,
                 early_state: dict | None, append: bool, desc: str, virtual: bool = False):
        tc = cfg.train
        self.tc, self.virtual, self.rate = tc, virtual, rate_key(virtual)
        self.writer = MetricsWriter(tc.out, tc.tensorboard, append=append)
        self.bar = tqdm(total=total_steps, initial=start_step, disable=not tc.progress,
                        unit="step", dynamic_ncols=True, desc=desc)
        self.logs = Cadence(tc.log_every, start_step)
        self.evals = Cadence(tc.eval_every, start_step)
        # None unless early stop / keep_best; a resumed run goes on from the checkpoint's best
        self.stopper = EarlyStopper.from_config(cfg, checkpoints, early_state)

    def train_record(self, step: int, steps_per_epoch: int, window: dict | None,
                     run_totals: dict, rate: float, wall: float, **more) -> dict:
        """Write the ``train`` record at `step`: the window's sums (`contract.sum_metrics` of
        the batches since the last record; None: none), the whole run's Train NE from
        `run_totals`, the `rate` (examples per second, or per virtual second) and `more`."""
        tc = self.tc
        rec = {"kind": "train", "step": step, "epoch": (step - 1) // max(steps_per_epoch, 1),
               "examples": step * tc.batch_size}
        if window is not None:
            rec.update(loss=window["loss"], train_ne_window=contract.ne_from_sums(window))
        if run_totals["count"]:
            rec["train_ne"] = contract.ne_from_sums(run_totals)
        if window is not None:
            rec.update(contract.window_sums(window))
        rec.update({self.rate: rate, "wall": wall, **more})
        self.writer.write(rec)
        if "train_ne" in rec:
            unit = "ex/vs" if self.virtual else "ex/s"
            self.bar.set_postfix({"loss": f"{rec.get('loss', float('nan')):.4f}",
                                  "ne": f"{rec['train_ne']:.4f}", unit: f"{rate:,.0f}"},
                                 refresh=False)
        return rec

    def counters_record(self, step: int, counters: dict) -> None:
        """A ``counters`` record: the algorithm's own counters (nested dicts flattened)."""
        self.writer.write({"kind": "counters", "step": step, **flat_scalars(counters)})

    def eval_record(self, step: int, ev: dict) -> None:
        self.writer.write({"kind": "eval", "step": step, **ev})

    def track(self, step: int, ev: dict, save: Callable, final: bool = False) -> bool:
        """Hand the eval `ev` at `step` to the early stopper: an improving one is written to
        out/best/ by ``save(checkpointer)``; True when the run is to stop here (the patience ran
        out). The `final` eval of a run that reached its end stops nothing. Without early
        stopping or keep_best: False."""
        st = self.stopper
        if st is None:
            return False
        if st.update(step, ev):
            st.save_best(save)
        if st.should_stop and not final:
            st.stopped_at = step
            return True
        return False

    def progress(self, step: int) -> None:
        """The bar at `step`."""
        self.bar.update(step - self.bar.n)

    def close(self) -> None:
        self.bar.close()
        self.writer.close()
        if self.stopper is not None:
            self.stopper.close()
