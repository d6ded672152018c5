"""The one module of the core library that starts threads: prefetch and thread groups.

`Prefetcher` runs an iterator in a daemon producer thread that fills a bounded queue, so parsing
(and, with ``transform=jax.device_put``, the host-to-device copy) overlaps training. The pattern
is levanter's: bounded queue, a stop Event, producer exceptions re-raised in the consumer with
the producer's traceback, and a ``close()`` that returns promptly however the consumer stopped.

    with Prefetcher(batches(source, 512, ...), depth=4) as it:
        for batch, n_valid in it:
            ...

`ThreadGroup` starts the host-async runtime's threads (workers, shadow threads): named daemon
threads, one shared stop Event, the first exception re-raised in the caller with its traceback.

`ordered_map` maps a function over items on a thread pool, results in order (the synthetic
generator's chunks on a many-core host).
"""

from __future__ import annotations

import collections
import queue
import threading
import time
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


class ThreadGroup:
    """Named daemon threads sharing one stop Event; the first failure stops them all.

    The host-async runtime (``algorithms/runtime.py``) starts every thread it needs through a
    group, so that shutdown has one path: an exception in any thread is recorded (with its
    traceback) and sets the shared ``stop`` Event; the caller's `wait` re-raises it. Thread bodies
    must poll ``stop`` (or block with ``stop.wait(t)`` / short timeouts) to end promptly.

        group = ThreadGroup("recjax-runtime")
        try:
            for i in range(4):
                group.spawn(body, i, group.stop, name=f"worker-{i}")
            group.wait()          # re-raises the first thread exception; Ctrl-C lands here
        finally:
            group.close()         # sets stop, joins with a timeout

    Args:
      name: prefix of the threads' names (``f"{name}-{thread name}"``).
    """

    def __init__(self, name: str = "recjax-group"):
        self.name = name
        self.stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._error: BaseException | None = None

    def spawn(self, target: Callable[..., Any], *args: Any, name: str) -> threading.Thread:
        """Start ``target(*args)`` in a named daemon thread of this group."""
        if self.stop.is_set():
            raise RuntimeError(f"thread group {self.name} is stopped; start a new group")
        t = threading.Thread(target=self._body, args=(target, args), name=f"{self.name}-{name}",
                             daemon=True)
        self._threads.append(t)
        t.start()
        return t

    def _body(self, target: Callable[..., Any], args: tuple) -> None:
        try:
            target(*args)
        except BaseException as e:  # noqa: BLE001 -- recorded and re-raised by the caller
            with self._lock:
                if self._error is None:
                    self._error = e
            self.stop.set()

    @property
    def error(self) -> BaseException | None:
        """The first exception raised by a thread of the group, if any."""
        return self._error

    def raise_if_failed(self) -> None:
        """Re-raise the first thread exception (its ``__traceback__`` holds the thread's frames)."""
        if self._error is not None:
            raise self._error

    def wait(self, threads: Iterable[threading.Thread] | None = None,
             timeout: float | None = None, on_poll: Callable[[], None] | None = None,
             poll_s: float = _POLL_S) -> bool:
        """Block until `threads` (default: all) have ended, a thread failed, or `timeout` passed.

        Waits in short joins, so a KeyboardInterrupt reaches the calling (main) thread promptly.

        Args:
          threads: the threads to wait for (e.g. only the workers, not background threads).
          timeout: seconds; None = no limit.
          on_poll: called every poll interval from the waiting thread (e.g. progress logging).
          poll_s: the poll interval (a thread's end is seen at once; a failure, within it).

        Returns:
          True when the threads ended, False on timeout.

        Raises:
          The first exception raised by any thread of the group.
        """
        pending = list(self._threads if threads is None else threads)
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            self.raise_if_failed()
            pending[0].join(poll_s)
            pending = [t for t in pending if t.is_alive()]
            if on_poll is not None:
                on_poll()
            if deadline is not None and time.monotonic() > deadline:
                self.raise_if_failed()
                return False
        self.raise_if_failed()
        return True

    def close(self, timeout: float = 10.0) -> list[threading.Thread]:
        """Set ``stop`` and join every thread (idempotent); returns the threads still alive."""
        self.stop.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(max(deadline - time.monotonic(), 0.0))
        return [t for t in self._threads if t.is_alive()]

    @property
    def alive(self) -> list[threading.Thread]:
        return [t for t in self._threads if t.is_alive()]

    def __enter__(self) -> ThreadGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def ordered_map(fn: Callable[[Any], T], items: Iterable[Any], workers: int,
                ahead: int | None = None) -> Iterator[T]:
    """``map(fn, items)`` on `workers` pool threads, results in input order, at most `ahead`
    (default ``2 * workers``) computed ahead of the consumer. For work that releases the GIL
    (numpy), e.g. generating synthetic chunks on a many-core host. ``workers <= 1`` is the plain
    ``map`` in the caller's thread. Closing the iterator early cancels what has not started and
    waits for what has; an exception in `fn` is raised at its place in the order.
    """
    if workers <= 1:
        yield from map(fn, items)
        return
    from concurrent.futures import ThreadPoolExecutor

    ahead = ahead or 2 * workers
    with ThreadPoolExecutor(workers, thread_name_prefix="recjax-map") as pool:
        pending: collections.deque = collections.deque()
        try:
            for item in items:
                pending.append(pool.submit(fn, item))
                if len(pending) >= ahead:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()
