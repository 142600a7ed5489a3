"""Window orders made ahead on a helper thread while the reading thread gathers the windows before them.

A window's order (``torchrecord._order.windows.window_order``) is NumPy's PCG64
Fisher-Yates shuffle: about 12 ns a sample here, plus 15 us a window to seed its
generator. On tiny samples gathered at memory speed that is a tenth of the epoch or
more (500,000 samples of 72 bytes). NumPy's shuffle releases the GIL, so a helper
thread makes the orders of the next few groups of windows while the reading thread
gathers the current one. The orders are the same arrays, made by the same pure
function, as without the helper: only when they are made changes.

The helper runs only where it pays (:func:`orders_ahead_pay`): samples small enough
that the order is a real part of their cost, enough of them to pay for a thread,
and a CPU to spare beside every process of the DataLoader. Measured with
``RecordLoader``, alternating in one process (``OMP_NUM_THREADS=1``, 2 CPUs): tiny
vectors packed, 0 workers, 59-66 ms an epoch with the helper against 65-68 without;
small images packed (3 KB samples), 36-40 ms against 35-37 (the order is 3% of
their epoch; the thread's hand-offs cost more); 2 workers, 72-77 ms against 72-74.

Threads and fork: before a fork every running helper is stopped after the order it is
making, and waited for (``os.register_at_fork``), so a child never inherits one
half-way through an order; the reader it served makes the rest of its orders itself.
(A helper waiting for its reader to catch up would otherwise wait forever when that
reader's own thread forks: a DataLoader with workers started inside the loop.) The
helper makes at most :data:`AHEAD` groups ahead of the reader and stops when the
reading ends.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import numpy as np
from torch.utils.data import get_worker_info

__all__ = ["AHEAD", "AHEAD_SAMPLES", "AHEAD_SAMPLE_BYTES", "OrdersAhead", "orders_ahead_pay"]

#: Groups whose orders the helper makes ahead of the one the reader takes.
AHEAD = 2

#: Shares of fewer samples make their orders in the reading thread (a thread start costs more than it saves).
AHEAD_SAMPLES = 1 << 15

#: Samples of more bytes make their orders in the reading thread (the order is a small part of their cost).
AHEAD_SAMPLE_BYTES = 1 << 10

_running: set[OrdersAhead] = set()
_running_lock = threading.Lock()


def _stop_helpers() -> None:
    """Before a fork: stop every running helper after the order it is making and wait for it, so that the child
    inherits none half-way (a helper waiting for its reader, which is this forking thread, would never end)."""
    with _running_lock:
        running = list(_running)
    for ahead in running:
        ahead.close()


def _forget_helpers() -> None:
    """In a forked child: a lock of its own (the parent's may have been held by another of its threads)."""
    global _running_lock
    _running_lock = threading.Lock()
    _running.clear()


if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
    os.register_at_fork(before=_stop_helpers, after_in_child=_forget_helpers)


def orders_ahead_pay(samples: int, sample_bytes: int) -> bool:
    """Is a helper worth starting for a share of ``samples`` shuffled samples of ``sample_bytes`` each: small
    samples, enough of them, and more CPUs than the DataLoader's processes (its workers and the main process)
    this process may run on?"""
    if samples < AHEAD_SAMPLES or sample_bytes > AHEAD_SAMPLE_BYTES:
        return False
    affinity = getattr(os, "sched_getaffinity", None)
    cpus = len(affinity(0)) if affinity is not None else os.cpu_count() or 1
    info = get_worker_info()
    return cpus > 1 + (info.num_workers if info is not None else 0)


class OrdersAhead:
    """The orders of ``count`` groups, ``make(g)`` each, made on a helper thread up to :data:`AHEAD` groups ahead
    of the one last asked for (``orders(g)``, in order: the same array ``make(g)`` gives).

    ``make`` must be a pure function (it runs on the helper). An error it raises there is not lost: the reading
    thread makes that group's order itself and meets the error in its turn.
    """

    def __init__(self, make: Callable[[int], np.ndarray | None], count: int) -> None:
        self._make, self._count = make, count
        self._made: dict[int, np.ndarray | None] = {}
        self._wanted = 0  # the group the reader takes next
        self._ended = False  # the helper made every order it will make (or failed, or was stopped)
        self._stop = False
        self._turn = threading.Condition()
        self._helper = threading.Thread(target=self._run, name="torchrecord-orders", daemon=True)
        with _running_lock:
            _running.add(self)
        self._helper.start()

    def _run(self) -> None:
        turn = self._turn
        try:
            for g in range(self._count):
                with turn:
                    while not self._stop and g > self._wanted + AHEAD:
                        turn.wait()
                    if self._stop:
                        return
                order = self._make(g)
                with turn:
                    self._made[g] = order
                    turn.notify_all()
        except BaseException:  # the reading thread makes the order itself (and meets the error there)
            pass
        finally:
            with turn:
                self._ended = True
                turn.notify_all()

    def __call__(self, g: int) -> np.ndarray | None:
        """Group ``g``'s order (waiting for the helper as far as needed). Groups are taken in order."""
        turn = self._turn
        with turn:
            self._wanted = g
            turn.notify_all()
            while g not in self._made and not self._ended:
                turn.wait()
            if g in self._made:
                return self._made.pop(g)
        return self._make(g)

    def close(self) -> None:
        """Stop the helper (after the order it is making) and wait for it; the orders not made yet are then
        made when asked for, in the asking thread."""
        with self._turn:
            self._stop = True
            self._turn.notify_all()
        self._helper.join()
        with _running_lock:
            _running.discard(self)
