"""Checksums computed on a helper thread, in the order the batches need the records.

With ``check="checksums"``, the CRC-32 of every value read has to be computed before
a byte of it reaches a batch. On long records that is a second pass over memory at
CRC speed (ISA-L's about 8 GB/s here) in front of the gather, which itself runs at
memory speed: 1.3-1.6x the epoch without checks. ``RecordDataset``'s fixed-layout
path therefore reads each window of long samples (``fastread.checks_ahead_pay``: copied
a sample at a time, a copy that lets the GIL go) one window early (keys and layout
checked as always, in the reading thread) and hands its CRC-32s to a helper thread
(:class:`ChecksAhead`), which computes them record by record in the order the
window's batches will use them, while the batches before are gathered; both CRC
implementations release the GIL on long buffers. Once a batch is gathered (a copy
that runs while the helper computes the same batch's records), :meth:`ChecksAhead.settle`
waits until the helper has done them and compares their CRC-32s with the stored ones,
before the batch is handed out: no unchecked byte is handed out, and a mismatch raises
the same ChecksumError, naming the record, as a check in the reading thread would (at
the first batch that holds a sample of the record). A batch refused so was copied into
its array (a worker's slot, an ``out=``) but never handed out.

The helper's loop takes the GIL between two records: beside a reading thread that keeps it (samples
gathered by one NumPy fancy index) it mostly waits, so windows of shorter samples are checked as each is
found instead.

Where the stored checksums are not one a record (blocks of several short records;
damaged entries), the helper checks the whole window and the first batch waits for
all of it. A window whose records the address books know every one of comes as one
:class:`KnownChecks` (each record a view of the map, its stored CRC-32 from the block
checksums), not as its walks' run checks. One helper computes at a time: a window is
read one ahead, so the next window's helper waits for the one before (two at once took
both cores from the reading thread).

Threads and fork: a helper lives only while it computes one window's checks. A fork
waits for it to finish (``os.register_at_fork``), so a forked child (a DataLoader
worker, a user's ``os.fork()``) never starts with a thread of ours half-way through
a CRC. Windows under :data:`THREAD_BYTES` are checked in the reading thread when
settled: a thread start would cost more than it saves.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from torchrecord._core.crc import crc32
from torchrecord._store.addresses import views_at
from torchrecord._store.walk import DeferredCheck, Walk, block_damaged
from torchrecord.errors import ChecksumError

if TYPE_CHECKING:
    from torchrecord._store.address_book import Booked

__all__ = ["ChecksAhead", "KnownChecks", "THREAD_BYTES", "one_ahead"]

T = TypeVar("T")

#: Windows whose values hold fewer bytes are checked in the reading thread.
THREAD_BYTES = 1 << 20

#: The helper tells the reading thread how far it got after this many records (and at the end).
_REPORT_EVERY = 4

_helpers: set[threading.Thread] = set()


def _wait_for_helpers() -> None:
    """Before a fork: let every running helper finish, so that the child inherits none half-way."""
    for helper in list(_helpers):
        helper.join()
        _helpers.discard(helper)


def _helping(after: ChecksAhead | None, target: Callable[[], None]) -> None:
    """The helper's body: ``target`` once the helper of ``after`` (the window before) has finished, so that one
    helper computes at a time and two windows' helpers (a window is read one ahead) never take both cores from
    the reading thread."""
    try:
        helper = after._helper if after is not None else None
        if helper is not None:
            helper.join()
        target()
    finally:
        _helpers.discard(threading.current_thread())


if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
    os.register_at_fork(before=_wait_for_helpers)


class ChecksAhead:
    """The checks of one window's runs (a walk's ``defer_checks`` list, in read order), computed on a helper.

    Args:
        checks: the window's run checks; their values, joined, are the window's records in row order.
        need: the window rows in the order the batches will use them (repeats allowed).

    The walks they came from must stay open until :meth:`settle` has confirmed every
    row used or :meth:`join` has returned: the values may be views of LMDB's map.
    """

    def __init__(self, checks: Sequence[DeferredCheck], need: np.ndarray, after: ChecksAhead | None = None) -> None:
        self._checks = list(checks)
        # a window looked up sample by sample (one row a sample) is checked a record at a time: rows mapped
        self._row_records = checks[0].window_rows if len(checks) == 1 and isinstance(checks[0], KnownChecks) else None
        if self._row_records is not None:
            need = self._row_records[need]
        self._failure: BaseException | None = None
        self._helper: threading.Thread | None = None
        self._stop = False
        self._values = [value for check in self._checks for value in check.values]
        parts = [check.record_crcs() for check in self._checks]
        self._expected = None if any(p is None for p in parts) else np.concatenate([*parts, np.zeros(0, np.uint32)])
        if self._expected is not None:
            rows = len(self._values)
            first_use = np.full(rows, len(need), np.int64)  # the rows in the order of their first use
            np.minimum.at(first_use, need, np.arange(len(need)))
            self._sequence = np.argsort(first_use, kind="stable")[: int(np.count_nonzero(first_use < len(need)))]
            self._place = np.full(rows, rows, np.int64)  # each row's place in the sequence
            self._place[self._sequence] = np.arange(len(self._sequence))
            self._actual = np.zeros(rows, np.uint32)
            self._done = 0  # rows of the sequence computed
            self._progress = threading.Condition()
        #: the helper computes record by record, in the order of ``need`` (else run by run, or no helper)
        self._by_rows = False
        if sum(check.nbytes for check in self._checks) >= THREAD_BYTES:
            self._by_rows = self._expected is not None
            target = self._compute_rows if self._by_rows else self._compute_runs
            helper = threading.Thread(target=_helping, args=(after, target), name="torchrecord-checksums", daemon=True)
            _helpers.add(helper)
            helper.start()
            self._helper = helper

    # -- the helper ----------------------------------------------------------
    def _compute_runs(self) -> None:
        for check in self._checks:
            if self._stop:
                return
            check.compute()  # never raises: a failure is kept for settle

    def _compute_rows(self) -> None:
        values, actual, sequence = self._values, self._actual, self._sequence.tolist()
        try:
            for i, row in enumerate(sequence, 1):
                actual[row] = crc32(values[row])
                if i % _REPORT_EVERY == 0 or i == len(sequence):
                    with self._progress:
                        self._done = i
                        self._progress.notify_all()
                    if self._stop:
                        return
        except BaseException:  # the reading thread checks the window itself (and meets the error there)
            with self._progress:
                self._done = -1
                self._progress.notify_all()

    # -- the reading thread --------------------------------------------------
    @property
    def done(self) -> bool:
        """True when no helper is computing (settled, joined, or checked in the reading thread)."""
        return self._helper is None or not self._helper.is_alive()

    def join(self, stop: bool = False) -> None:
        """Wait for the helper to finish (``stop``: after the record it is on); raises nothing."""
        helper, self._helper = self._helper, None
        if helper is not None:
            self._stop = stop
            helper.join()
            _helpers.discard(helper)

    def settle(self, rows: np.ndarray | None = None) -> None:
        """Raise ChecksumError, naming the record at fault, unless every record at ``rows`` (window rows; None:
        the whole window) matched its stored CRC-32; waits for the helper as far as needed. A refused window
        stays refused."""
        if self._failure is not None:
            raise self._failure
        try:
            if self._by_rows and rows is not None:
                self._settle_rows(rows if self._row_records is None else self._row_records[rows])
            else:
                self._settle_all()
        except BaseException as failure:
            self._failure = failure
            raise

    def _settle_all(self) -> None:
        self.join()
        checks, self._checks = self._checks, []
        for check in checks:
            check.settle()

    def _settle_rows(self, rows: np.ndarray) -> None:
        if not len(rows):
            return
        need = int(self._place[rows].max()) + 1
        if need > len(self._sequence):  # a row outside the order given: check the whole window
            self._settle_all()
            return
        with self._progress:
            while 0 <= self._done < need:
                self._progress.wait()
            failed = self._done < 0
        if failed:
            self._settle_all()
            return
        assert self._expected is not None
        wrong = rows[self._actual[rows] != self._expected[rows]]
        if len(wrong):
            self._name(int(wrong[0]))
        if need == len(self._sequence):
            self.join()

    def _name(self, row: int) -> None:
        """Raise the reading thread's own error for the run holding ``row`` (it recomputes that run)."""
        self.join(stop=True)
        at = 0
        for check in self._checks:
            if row < at + len(check.values):
                check.settle()  # raises, naming the record (and saying whether the block checksums are damaged)
                raise ChecksumError(f"{check.name(row - at)}: CRC-32 does not match the stored checksum")
            at += len(check.values)


class KnownChecks:
    """The checksum check of a window whose records the address books know whole (``fastread``'s lookup of each
    sample's record), deferred as a walk's run check is (:class:`ChecksAhead` computes it): each record's value
    a view of LMDB's map, its stored CRC-32 held in memory (``Walk.record_crcs``: no LMDB call).

    Args:
        values: each record's value (views of the map), in the books' row order (``address_book.Booked``).
        expected: each one's stored CRC-32.
        walks, owner, records: row ``r`` is record ``records[r]`` of ``walks[owner[r]]`` (to name it).
        window_rows: the row of each window row's record (a window of one row a sample).
    """

    def __init__(
        self,
        values: list[Any],
        expected: np.ndarray,
        walks: Sequence[Walk],
        owner: np.ndarray | None,
        records: np.ndarray,
        window_rows: np.ndarray,
    ) -> None:
        self.values, self._expected, self.window_rows = values, expected, window_rows
        self._walks, self._owner, self._records = list(walks), owner, records
        self._matched: bool | None = None

    @classmethod
    def of(cls, known: Booked, length: int, window_rows: np.ndarray) -> KnownChecks | None:
        """The check of the records ``known`` locates (every address known, ``length`` bytes each), or None where a
        walk does not hold its stored CRC-32s in memory."""
        expected = known.stored_crcs()
        if expected is None:
            return None
        values = views_at(known.addresses, length)
        return cls(values, expected, known.walks, known.owner, known.records, window_rows)

    @property
    def nbytes(self) -> int:
        """The bytes of the values this check reads."""
        return sum(map(len, self.values))

    def record_crcs(self) -> np.ndarray:
        """The stored CRC-32 of each record, in row order."""
        return self._expected

    def compute(self) -> None:
        """Compute every CRC-32 and compare them with the stored ones (never raises)."""
        actual = np.fromiter(map(crc32, self.values), np.uint32, len(self.values))
        self._matched = bool(np.array_equal(actual, self._expected))

    def name(self, row: int) -> str:
        """``"<file>: record <index>"`` of row ``row``."""
        return f"{self._walk_of(row).path}: record {int(self._records[row])}"

    def _walk_of(self, row: int) -> Walk:
        return self._walks[0 if self._owner is None else int(self._owner[row])]

    def settle(self) -> None:
        """Raise ChecksumError, naming the record at fault, unless every record matched its stored CRC-32."""
        if self._matched is None:
            self.compute()
        if self._matched:
            return
        actual = np.fromiter(map(crc32, self.values), np.uint32, len(self.values))
        row = int(np.flatnonzero(actual != self._expected)[0])
        self._walk_of(row).check_each([self.values[row]], int(self._records[row]))  # its own stored CRC-32
        record = int(self._records[row])
        raise block_damaged(self._walk_of(row).path, record, record + 1)


def one_ahead(items: Iterator[T]) -> Iterator[T]:
    """``items``, each made one step early: the next is made before the one before is handed out (a window read
    ahead, so that its checksums are computed meanwhile); an error making it is raised only after the one before
    has been handed out, where it would come without."""
    try:
        held = next(items)
    except StopIteration:
        return
    while True:
        failure: Exception | None = None
        try:
            following = next(items)
        except StopIteration:
            yield held
            return
        except Exception as error:  # raised in its turn, below
            failure = error
        yield held
        if failure is not None:
            raise failure
        held = following
