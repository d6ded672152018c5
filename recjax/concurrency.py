"""The one module of the core library that starts threads: background prefetch.

`Prefetcher` runs an iterator in a daemon producer thread that fills a bounded queue, so parsing
(and, with ``transform=jax.device_put``, the host-to-device copy) overlaps training. The pattern
is levanter's: bounded queue, a stop Event, producer exceptions re-raised in the consumer with
the producer's traceback, and a ``close()`` that returns promptly however the consumer stopped.

    with Prefetcher(batches(source, 512, ...), depth=4) as it:
        for batch, n_valid in it:
            ...
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_POLL_S = 0.05  # how often a blocked put/get re-checks the stop flag / producer liveness


class _End:
    """Queue marker: the producer finished its iterator."""


class _Failure:
    """Queue marker: the producer raised `error`."""

    def __init__(self, error: BaseException):
        self.error = error


def _produce(iterable: Iterable[Any], transform: Callable[[Any], Any] | None,
             out: queue.Queue, stop: threading.Event) -> None:
    """Producer thread body. A plain function (not a method) so that the thread holds no
    reference to the `Prefetcher`, which can then be garbage collected and closed."""

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    it = iter(iterable)
    try:
        for item in it:
            if stop.is_set() or not put(item if transform is None else transform(item)):
                return
        put(_End())
    except BaseException as e:  # noqa: BLE001 -- handed to the consumer, who re-raises it
        put(_Failure(e))
    finally:
        close = getattr(it, "close", None)
        if close is not None:  # a generator's finally blocks (open files) run here, promptly
            close()


class Prefetcher(Generic[T]):
    """Iterate over `iterable` in a background thread, at most `depth` items ahead.

    Args:
      iterable: the items to produce (consumed in the producer thread only).
      depth: queue capacity, the number of items produced ahead of the consumer. 0 starts no
        thread: items are produced (and transformed) in the consumer's ``next``, which gives
        the same items in the same order, for debugging and deterministic runs.
      transform: optional function applied to each item in the producer thread
        (e.g. ``jax.device_put``).
      name: thread name, for debuggers and `threading.enumerate`.

    Iterating yields the items in order; an exception raised by the producer is raised by the
    consumer's ``next`` (after which the prefetcher is closed). ``close()`` (or leaving the
    ``with`` block) stops the producer and joins it.
    """

    def __init__(self, iterable: Iterable[T], depth: int = 2,
                 transform: Callable[[T], Any] | None = None, name: str = "recjax-prefetch"):
        if depth < 0:
            raise ValueError(f"depth must be >= 0, got {depth}")
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._inline: Iterator[Any] | None = None
        self._thread: threading.Thread | None = None
        if depth == 0:
            self._source = iter(iterable)
            self._inline = self._source if transform is None else map(transform, self._source)
            return
        self._thread = threading.Thread(target=_produce, name=name, daemon=True,
                                        args=(iterable, transform, self._queue, self._stop))
        self._thread.start()

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        if self._inline is not None:
            return next(self._inline)
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self.close()  # stopped by close() from elsewhere
                    raise StopIteration from None
        if isinstance(item, _End):
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            raise item.error  # keeps the producer's traceback, adds this frame
        return item

    def close(self, timeout: float = 10.0) -> None:
        """Stop the producer and wait for its thread to end (idempotent).

        The producer notices the stop flag within ``_POLL_S`` unless it is inside a slow call of
        the wrapped iterator; `timeout` bounds the wait for that (the thread is a daemon, so it
        never keeps the process alive).
        """
        self._done = True
        self._stop.set()
        if self._thread is None:
            close = getattr(self._source, "close", None)
            if close is not None:
                close()
            return
        while True:  # drain, so a producer blocked on a full queue sees the flag at once
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """Whether the producer thread is still running."""
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # An abandoned prefetcher must not leave its producer running.
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
