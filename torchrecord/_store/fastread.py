"""The fixed-layout read path: a window's records found once, then batches gathered in bulk.

When every field has a fixed shape, every record has the same byte layout
(``torchrecord._core.layout``). Long records (at least :data:`JOIN_LIMIT`) are
read through the walk as zero-copy views of the LMDB map and checked against the
layout's template where they lie, all at once (length and every non-payload byte,
vectorized over the map: :class:`Mapped`); short ones (and compressed ones,
decompressed) are copied into one recycled window buffer and checked there. Any
record that differs is decoded the checked slow way and re-encoded, so nothing is
misread. Batches are then gathered field by field at fixed offsets into fresh,
contiguous arrays (:meth:`FixedWindow.gather`): a long record's samples are copied
once, straight from the map into the batch. Where each long record lies, once found
and checked, goes into its file's address book (``address_book``): a later pass in
the process finds a window whose records the book knows without walking or checking
them again, and walks only the pieces of a window holding a record it does not know
(a persistent DataLoader worker reads another share each epoch, so its book fills
over several). A window read from the map whose books know it whole is a lookup of each sample's record
(:meth:`FixedWindowReader.read_known`; with checksums, its records checked as a whole first),
and its batches are gathered at offsets worked out once for the window
(:meth:`FixedWindow.places`).

The module is long (about 870 lines) because it is one mechanism: the window's records found
(:class:`_WindowBuilder`, or an address book), where they lie (:class:`Mapped`) and the gather
from them (:class:`FixedWindow`) share their layout arithmetic and invariants.
"""

from __future__ import annotations

import ctypes
import itertools
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from numpy.lib.stride_tricks import as_strided

from torchrecord._core.crc import crc32
from torchrecord._core.layout import FixedLayout
from torchrecord._store.address_book import AddressBook, Booked, book_of, booked
from torchrecord._store.addresses import address_of, memory_at, view_addresses, views_at
from torchrecord._store.checks_ahead import KnownChecks
from torchrecord._store.walk import Walk

__all__ = [
    "FixedWindow",
    "FixedWindowReader",
    "JOIN_LIMIT",
    "Mapped",
    "PENDING_VIEWS",
    "ROW_COPY",
    "VIEW_LIMIT",
    "checks_ahead_pay",
    "gathers_from_map",
    "joins",
    "matches_stored_crcs",
    "read_as_views",
]

#: Records at least this long are checked and gathered where they lie in LMDB's map; shorter ones are read
#: as bytes and joined into one window buffer first. For short records the walk's zero-copy views cost more
#: than the copy they save: each is an object the garbage collector tracks (bytes are not), and a pass over
#: 500,000 records of 100 B made it run full collections (0.1 s each beside torch) several times an epoch.
JOIN_LIMIT = 16 << 10

Run = tuple[int, int]


#: Records at least this long are read as views of the map even where they are joined (shorter than
#: :data:`JOIN_LIMIT`): a view dies once its record is copied into the window buffer, and where it lay goes into
#: the address book, so that a later pass copies a window's records from the map in one call, without a walk
#: (tiny vectors packed 112 a record: 7.6 KB).
VIEW_LIMIT = 4 << 10


def joins(layout: FixedLayout) -> bool:
    """True when records are copied (or decompressed) into the window buffer; False: read from the map."""
    return layout.length < JOIN_LIMIT or layout.expander is not None


def gathers_from_map(layout: FixedLayout) -> bool:
    """True when a window's samples are gathered straight from LMDB's map: records read as views, neither
    copied nor decompressed into a window buffer (a window then holds no memory of its own)."""
    return read_as_views(layout) and not joins(layout)


def checks_ahead_pay(layout: FixedLayout) -> bool:
    """True where a window's checksums are worth computing on a helper thread (``checks_ahead``): records read
    from the map whose largest field is copied a sample at a time (at least :data:`ROW_COPY`), a copy that lets
    the GIL go, so the helper's loop (which needs the GIL between two records) runs beside it. Smaller samples
    are gathered by one NumPy fancy index that keeps the GIL: the helper would wait for it, and checking each
    window as it is found costs less (small images packed 25 a record, a /tmp script: 47.9 ms an epoch against
    60.7 ms with the helper and 29.5 ms without checksums; large images, 147 KB: 284.7 against 217.7 and 167.8).
    """
    return not joins(layout) and max(layout.sample_bytes, default=0) >= ROW_COPY


def read_as_views(layout: FixedLayout) -> bool:
    """True when the walk hands records out as views of the map (not bytes): long ones, and compressed ones
    (decompressed straight from the map)."""
    return layout.length >= VIEW_LIMIT or layout.expander is not None


#: Views of the map whose addresses are read in one call at most (see ``_WindowBuilder``).
PENDING_VIEWS = 4096

#: Where torch may not run (:func:`_one_thread`) and a batch is gathered into a given array, samples at least
#: this long are copied from the map one by one (one memcpy each, no temporary); shorter ones with one fancy
#: index a field (vectorized, through a temporary).
ROW_COPY = 32 << 10


class Mapped:
    """Where a window's records lie in memory (LMDB's map): one uint8 view over the span that holds them all,
    and each record's offset in it, so that a field of many samples is gathered straight from the map into the
    batch in one NumPy call, without a Python step a record or a sample.

    The records lie in LMDB's map (read with py-lmdb ``buffers=True``; valid while the walk's transaction
    is open, which outlives the window) or in re-encoded buffers this object keeps alive (``views``); the
    span is read at their offsets only. torch touches the map only where it runs on one thread
    (:func:`_one_thread`): with more, a torch operation could start OpenMP threads, which hang in a process
    forked after its parent used them (a user's ``os.fork()`` child reading a set).
    """

    def __init__(self, views: Sequence[Any], addresses: np.ndarray, length: int) -> None:
        base = int(addresses.min())
        span = int(addresses.max()) + length - base
        self.views = views  # buffers outside the map that offsets point into
        self.offsets = addresses - base
        self.memory = memory_at(base, span)
        self._rows: dict[int, np.ndarray] = {}
        self._tensor_rows: dict[int, torch.Tensor] = {}

    def rows(self, size: int) -> np.ndarray:
        """The span as ``size``-byte items starting at every byte offset (a stride-1 view: items overlap).

        A fancy index reads only the items asked for (``np.take`` would first copy the whole view).
        """
        view = self._rows.get(size)
        if view is None:
            count = len(self.memory) - size + 1
            view = self._rows[size] = np.ndarray((count,), np.dtype((np.void, size)), self.memory, 0, (1,))
        return view

    def tensor_rows(self, size: int) -> torch.Tensor:
        """:meth:`rows` as a (count, size) uint8 tensor, for ``torch.index_select`` (only ever read)."""
        view = self._tensor_rows.get(size)
        if view is None:
            memory = memory_at(self.memory.ctypes.data, len(self.memory), read_only=False)
            view = self._tensor_rows[size] = _byte_rows(memory, size)
        return view

    def differing(self, records: np.ndarray, segments: Sequence[tuple[int, int, bytes]]) -> np.ndarray:
        """The positions in ``records`` (rows of this window) whose bytes differ from ``segments``.

        ``segments`` are ``(start, stop, bytes)`` pieces of a record (the layout's non-payload bytes); each is
        compared for all records at once. The records must be at least as long as the last segment's stop.
        """
        bad = np.zeros(len(records), bool)
        offsets = self.offsets[records]
        for start, stop, expected in segments:
            got = self.rows(stop - start)[offsets + start].view(np.uint8).reshape(len(records), stop - start)
            bad |= (got != np.frombuffer(expected, np.uint8)).any(axis=1)
        return np.flatnonzero(bad)

    def take(self, rec: np.ndarray, row: np.ndarray, offset: int, size: int, dst: np.ndarray | None) -> np.ndarray:
        """Copy field bytes (``offset`` in the record, ``size`` a sample) of samples ``(rec, row)`` into ``dst``.

        ``dst`` is a C-contiguous (len(rec), size) uint8 array, or None for a fresh one. Returns it.
        """
        return self.take_at(self.offsets[rec] + (offset + row * size), size, dst)

    def take_at(self, where: np.ndarray, size: int, dst: np.ndarray | None) -> np.ndarray:
        """Copy the ``size`` bytes at each offset ``where`` of the span into ``dst`` (as :meth:`take`), or into a
        fresh array (None). Returns it."""
        if size < ROW_COPY and dst is None:  # the fancy index's result is the batch: no second copy
            fresh: np.ndarray = self.rows(size)[where].view(np.uint8).reshape(len(where), size)
            return fresh
        return self.copy(where, size, np.empty((len(where), size), np.uint8) if dst is None else dst)

    def copy(self, where: np.ndarray, size: int, dst: np.ndarray) -> np.ndarray:
        """Copy the ``size`` bytes at each offset ``where`` of the span into the rows of ``dst`` (a C-contiguous
        (len(where), size) uint8 array). Returns it."""
        if _one_thread():  # one copy a sample, straight into dst
            torch.index_select(self.tensor_rows(size), 0, torch.from_numpy(where), out=torch.from_numpy(dst))
        elif size >= ROW_COPY:
            memory = self.memory
            for i, at in enumerate(where.tolist()):
                dst[i] = memory[at : at + size]
        else:  # through a temporary
            dst.view(np.dtype((np.void, size))).reshape(len(dst))[...] = self.rows(size)[where]
        return dst


def _byte_rows(memory: np.ndarray, size: int) -> torch.Tensor:
    """A 1-d uint8 array as ``size``-byte rows starting at every byte offset: a (len - size + 1, size) tensor
    view (rows overlap), to gather rows by byte offset with one ``torch.index_select``."""
    return torch.from_numpy(memory).as_strided((len(memory) - size + 1, size), (1, 1))


def _one_thread() -> bool:
    """True when torch runs its operations on this thread alone, so none can start OpenMP threads.

    A ``DataLoader`` worker runs on one thread; so does a process told ``torch.set_num_threads(1)``. Gathering
    a batch's samples into a given array (a worker's shared-memory slot) with ``torch.index_select`` copies
    each sample once, where NumPy's fancy index copies it into a temporary first: on small images gathered
    into a ring of slots larger than the cache, 34 ms an epoch against 46 ms.
    """
    return torch.get_num_threads() == 1


class FixedWindow:
    """Whole records of one window, addressed by sample coordinates (record row, row in record)."""

    def __init__(
        self,
        layout: FixedLayout,
        joined: np.ndarray | None,
        views: list[Any] | None,
        buffer: np.ndarray,
        mapped: Mapped | None = None,
    ) -> None:
        self.layout = layout
        self.mapped = mapped
        self.buffer = buffer  # the reader's storage, recycled once this window is gone
        length, k = layout.length, layout.rows
        self.fields: list[np.ndarray] = []
        #: per field, its samples as one (records, k) array of ``size``-byte items (None for an empty field):
        #: a fancy index then copies each sample with one memcpy instead of byte by byte
        self._items: list[np.ndarray | None] = []
        #: per field, the window's bytes as ``size``-byte items at every byte offset (None: an empty field or
        #: no record); :meth:`take` gathers samples by byte offset from them
        self._rows: list[np.ndarray | None] = []
        self._whole = np.empty(0, np.uint8)
        self._tensor_rows: dict[int, torch.Tensor] = {}
        if joined is not None:
            n = len(joined)
            self.fields = [
                as_strided(joined[:, off:], shape=(n, k, size), strides=(length, size, 1), writeable=False)
                for off, size in zip(layout.offsets, layout.sample_bytes)
            ]
            whole = np.ascontiguousarray(joined)
            self._items = [
                None
                if not size
                else np.ndarray((n, k), np.dtype((np.void, size)), buffer=whole, offset=off, strides=(length, size))
                if n
                else np.empty((0, k), np.dtype((np.void, size)))  # no record: no buffer to view
                for off, size in zip(layout.offsets, layout.sample_bytes)
            ]
            flat = whole.reshape(-1)
            self._whole = flat  # the window's bytes, for torch views (:meth:`_gather_into`)
            self._rows = [
                np.ndarray((len(flat) - size + 1,), np.dtype((np.void, size)), flat, 0, (1,)) if size and n else None
                for size in layout.sample_bytes
            ]
        self.views = views

    def take(self, field: int, rec: np.ndarray, row: np.ndarray) -> np.ndarray:
        """Field ``field``'s bytes of samples ``(rec, row)`` of a joined window, as a fresh (len(rec), size) uint8
        array.

        One fancy index over the field's items at every byte offset, by each sample's byte offset in the
        window. On fields of 8-64 bytes a sample it took 0.65-0.9 of the time of indexing the (records, k)
        items by two coordinates (the same on 3 KB samples), and a third to a quarter of the time of the
        byte-wise index of :attr:`fields` that ``RecordBlock`` used.
        """
        size = self.layout.sample_bytes[field]
        rows = self._rows[field]
        if rows is None:  # an empty field, or a window with no record
            items = self._items[field]
            if items is None:
                return np.empty((len(rec), 0), np.uint8)
            none_held: np.ndarray = items[rec, row].view(np.uint8).reshape(len(rec), size)
            return none_held
        where = rec * self.layout.length + (self.layout.offsets[field] + row * size)
        taken: np.ndarray = rows[where].view(np.uint8).reshape(len(rec), size)
        return taken

    def _gather_into(self, field: int, rec: np.ndarray, row: np.ndarray, dst: np.ndarray) -> None:
        """Field ``field``'s bytes of samples ``(rec, row)`` of a joined window copied into ``dst`` (C-contiguous
        (len(rec), size) uint8) with one ``torch.index_select`` by byte offset (only where torch runs on one
        thread: :func:`_one_thread`)."""
        size = self.layout.sample_bytes[field]
        view = self._tensor_rows.get(size)
        if view is None:
            view = self._tensor_rows[size] = _byte_rows(self._whole, size)
        where = rec * self.layout.length + (self.layout.offsets[field] + row * size)
        torch.index_select(view, 0, torch.from_numpy(where), out=torch.from_numpy(dst))

    def places(self, rec: np.ndarray, row: np.ndarray) -> list[np.ndarray] | None:
        """Per field, where samples ``(rec, row)`` lie in the map (offsets in :attr:`mapped`'s span), for
        :meth:`gather_at`: worked out once a window rather than once a batch. None unless the window is read
        from the map."""
        mapped = self.mapped
        if mapped is None:
            return None
        at = mapped.offsets[rec]
        return [at + (offset + row * size) for offset, size in zip(self.layout.offsets, self.layout.sample_bytes)]

    def gather_at(
        self, places: Sequence[np.ndarray], sel: slice, out: Sequence[np.ndarray | None] | None = None, at: int = 0
    ) -> list[Any]:
        """:meth:`gather` of the samples at ``places[f][sel]`` (:meth:`places`) of a window read from the map."""
        mapped = self.mapped
        assert mapped is not None
        sizes = self.layout.sample_bytes
        if out is None:
            return [mapped.take_at(where[sel], size, None) for where, size in zip(places, sizes)]
        for where, size, dst in zip(places, sizes, out):
            if dst is not None and size:
                mapped.take_at(where[sel], size, dst[at : at + len(where[sel])])
        return list(out)

    def gather_typed(
        self, places: Sequence[np.ndarray], sel: slice, shapes: Sequence[tuple[tuple[int, ...], Any]]
    ) -> list[np.ndarray]:
        """:meth:`gather_at` into fresh arrays, each field typed as it is gathered: ``shapes`` holds each field's
        sample shape and NumPy dtype (no bools: their bytes need a check)."""
        mapped = self.mapped
        assert mapped is not None
        typed = []
        for where, size, (shape, dtype) in zip(places, self.layout.sample_bytes, shapes):
            at = where[sel]
            if 0 < size < ROW_COPY:  # one fancy index, viewed as the field's type
                typed.append(mapped.rows(size)[at].view(dtype).reshape((len(at), *shape)))
            else:
                typed.append(mapped.take_at(at, size, None).view(dtype).reshape((len(at), *shape)))
        return typed

    def gather(
        self, rec: np.ndarray, row: np.ndarray, out: Sequence[np.ndarray | None] | None = None, at: int = 0
    ) -> list[Any]:
        """Copy the chosen samples' bytes, per field, into (len(rec), sample_bytes) uint8 arrays.

        This is the one place where a field's bytes leave a window: each sample is
        copied once, from the window buffer (short records) or straight from the
        LMDB map (long records, kept as views), into the batch. ``out`` (one array
        per field, ``at`` the first row to fill) lets a batch that spans windows be
        filled in place (a None entry leaves that field out); without it fresh arrays
        are made. Returns the arrays filled.
        """
        n = len(rec)
        if out is None and self.views is None:  # one vectorized gather per field into a fresh array
            return [self.take(f, rec, row) for f in range(len(self.fields))]
        if self.views is None:
            if out is None:
                out, at = [np.empty((n, size), np.uint8) for size in self.layout.sample_bytes], 0
            k = self.layout.rows
            first = _consecutive(rec * k + row) if n else None
            one_thread = _one_thread()
            for f, (field, items, dst) in enumerate(zip(self.fields, self._items, out)):
                if dst is None:  # a field the caller does not want
                    continue
                if first is not None:  # consecutive samples (an unshuffled read): strided copies, in place
                    _copy_run(field, first, dst[at : at + n], k)
                elif items is None:
                    dst[at : at + n] = field[rec, row]
                elif one_thread and self._rows[f] is not None:  # one copy a sample, straight into dst
                    self._gather_into(f, rec, row, dst[at : at + n])
                else:  # a fancy index gathers into a temporary first
                    dst[at : at + n].view(items.dtype)[:, 0] = items[rec, row]
            return list(out)
        if self.mapped is not None:  # one take a field, straight from the map
            if out is None:
                return [
                    self.mapped.take(rec, row, off, size, None)
                    for off, size in zip(self.layout.offsets, self.layout.sample_bytes)
                ]
            for off, size, dst in zip(self.layout.offsets, self.layout.sample_bytes, out):
                if dst is not None and size:
                    self.mapped.take(rec, row, off, size, dst[at : at + n])
            return list(out)
        # a window with no record (nothing to gather from): empty fields
        return list(out) if out is not None else [np.empty((0, size), np.uint8) for size in self.layout.sample_bytes]


def _consecutive(flat: np.ndarray) -> int | None:
    """The first sample's position when ``flat`` (positions in the window) is a run of consecutive ones."""
    n = len(flat)
    if int(flat[-1]) - int(flat[0]) != n - 1 or (n > 1 and not bool((np.diff(flat) == 1).all())):
        return None
    return int(flat[0])


def _copy_run(field: np.ndarray, first: int, dst: np.ndarray, k: int) -> None:
    """Copy ``len(dst)`` consecutive samples from window position ``first`` of ``field`` [records, k, size].

    At most three strided copies (the rest of the first record, whole records,
    the head of the last one) and no temporary.
    """
    n = len(dst)
    rec, row = divmod(first, k)
    pos = 0
    if row:
        m = min(k - row, n)
        dst[:m] = field[rec, row : row + m]
        pos, rec = m, rec + 1
    whole = (n - pos) // k
    if whole:
        dst[pos : pos + whole * k].reshape(whole, k, dst.shape[1])[...] = field[rec : rec + whole]
        pos, rec = pos + whole * k, rec + whole
    if pos < n:
        dst[pos:] = field[rec, : n - pos]


#: One piece of a window: (the walk of its shard, samples in that shard, start, stop) in shard indices.
Piece = tuple[Walk, int, int, int]


def _coordinates(
    starts: Sequence[int], lengths: Sequence[int], shifts: Sequence[int], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each sample's (window row of its record, row in the record) for pieces of samples [start, start + length),
    piece after piece, in a few NumPy calls for all pieces (a window of tiny samples has hundreds of pieces)."""
    counts = np.array(lengths, np.int64)
    piece_at = np.cumsum(counts) - counts  # each piece's first position among the window's samples
    samples = np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(np.array(starts, np.int64) - piece_at, counts)
    rec = samples // k  # a third of the time of np.divmod
    row = samples - rec * k
    rec += np.repeat(np.array(shifts, np.int64), counts)
    return rec, row


class FixedWindowReader:
    """Reads windows of a fixed-layout set through its shards' walks, recycling window buffers.

    Args:
        layout: the set's fixed layout.
        capacity: samples a window holds at most (sizes the first buffer).
    """

    def __init__(self, layout: FixedLayout, capacity: int) -> None:
        self.layout = layout
        self.joined = joins(layout)
        k = layout.rows
        self._capacity = (-(-capacity // k) + 2) * layout.length if self.joined else 0
        #: where records are found and kept in address books: read as views, and not compressed
        self._books = read_as_views(layout) and layout.expander is None
        #: windows whose books know them whole may be looked up (:meth:`read_known`): read from the map
        self.looks_up = gathers_from_map(layout)
        self._recycled: list[tuple[np.ndarray, weakref.ref[FixedWindow]]] = []

    def read(
        self, pieces: Sequence[Piece], before_decoding: Callable[[], None] | None = None
    ) -> tuple[FixedWindow, np.ndarray, np.ndarray]:
        """The window holding ``pieces`` (sample runs of shards), with each sample's (record row, row) in order.

        Each piece's walk is open (``buffers=True``) over its shard's records; the
        shard's sample count recognises its short final chunk. ``before_decoding``
        is called before a record unlike the template is decoded (the walks'
        deferred checksum checks are settled there: nothing is decoded unchecked).
        """
        layout, k = self.layout, self.layout.rows
        known = booked(pieces, k) if self._books else None
        if known is not None and known.addresses.all():  # every record where an earlier pass found and checked it
            mapped, found_shifts = _found_window(pieces, layout, known)
            if self.joined:  # copied from the map into the window buffer, all in one call
                window = FixedWindow(layout, *_copy_records(mapped, layout.length, self._buffer()))
            else:
                window = FixedWindow(layout, None, [], self._buffer(), mapped)
            self._recycled.append((window.buffer, weakref.ref(window)))
            starts, lengths = [p[2] for p in pieces], [p[3] - p[2] for p in pieces]
            return (window, *_coordinates(starts, lengths, found_shifts, k))
        build = _WindowBuilder(self.layout, self._buffer())
        # pieces the books know whole are not walked: added after the walked ones (a window's rows need not
        # follow its pieces), so that the walks' deferred checks stay in row order
        whole = known.known_pieces() if known is not None else [False] * len(pieces)
        shifts = [0] * len(pieces)  # per piece: the window row of a sample's record is sample // k + shift
        books: dict[int, AddressBook | None] = {}  # per walk (by id): where its checked records lie
        for i, (walk, count, start, stop) in enumerate(pieces):
            if whole[i]:
                continue
            first, last = start // k, (stop - 1) // k + 1
            book = None
            if self._books:
                book = books[id(walk)] = books[id(walk)] if id(walk) in books else book_of(walk)
            shifts[i] = build.add(first, walk.records(first, last), count, walk.path, book) - first
        if known is not None and any(whole):
            _add_known(build, pieces, known, whole, shifts)
        window = build.finish(before_decoding)
        self._recycled.append((window.buffer, weakref.ref(window)))
        starts, lengths = [p[2] for p in pieces], [p[3] - p[2] for p in pieces]
        rec, row = _coordinates(starts, lengths, shifts, k)
        return window, rec, row

    def read_known(
        self, pieces: Sequence[Piece], samples: np.ndarray
    ) -> tuple[FixedWindow, np.ndarray, np.ndarray] | None:
        """:meth:`read` of a window read from the map whose walks check no checksums and whose records their
        address books know every one of; ``samples`` are the pieces' samples, in order, each in its own shard's
        indices. None where that is not so (:meth:`read` then reads it).

        A handful of NumPy calls over the window's samples, none a piece: each sample's record is looked up
        in its book, and the window is a :class:`Mapped` of one row a sample (its record's address).
        """
        if not self.looks_up or not pieces:
            return None
        k = self.layout.rows
        records = samples // k
        walks = list(dict.fromkeys(p[0] for p in pieces))
        if len(walks) == 1:
            addresses = _looked_up(walks[0], records)
        else:  # each walk's samples looked up in its own book
            owner = np.repeat([walks.index(p[0]) for p in pieces], [p[3] - p[2] for p in pieces])
            addresses = np.zeros(len(records), np.int64)
            for i, walk in enumerate(walks):
                mine = owner == i
                found = _looked_up(walk, records[mine])
                if found is None:
                    return None
                addresses[mine] = found
        if addresses is None or not addresses.all():
            return None
        checked = any(p[0].checks for p in pieces)
        if checked and not self._check_known(pieces, samples):
            return None
        for walk, _, start, stop in pieces:  # counted as read (their checksums, if any, checked or handed over)
            walk.found(start // k, (stop - 1) // k + 1 - start // k, checked=checked)
        window = FixedWindow(self.layout, None, [], self._buffer(), Mapped([], addresses, self.layout.length))
        self._recycled.append((window.buffer, weakref.ref(window)))
        return window, np.arange(len(samples)), samples - records * k

    def _check_known(self, pieces: Sequence[Piece], samples: np.ndarray) -> bool:
        """Check the checksums of the records of a window its books know whole (:meth:`read_known`; ``samples`` as
        there), before a byte is used: all at once here (:func:`matches_stored_crcs`), or, where the walks defer
        their checks, handed to them (``checks_ahead.KnownChecks``, computed on a helper thread in the order the
        window's batches need them). False where the window is to be read the usual way (:meth:`read`): a
        record unknown, the stored CRC-32s not in memory, or a record that differs."""
        layout = self.layout
        known = booked(pieces, layout.rows)
        if known is None or not known.addresses.all():
            return False
        deferred = known.walks[0].deferred
        if deferred is None:
            return matches_stored_crcs(known, layout.length)
        lengths = [stop - start for _, _, start, stop in pieces]
        rows = np.repeat(known.row0s - known.firsts, lengths) + samples // layout.rows  # each sample's record
        checks = KnownChecks.of(known, layout.length, rows)
        if checks is None:
            return False
        deferred.append(checks)
        return True

    def learn_all(self, walk: Walk, count: int) -> None:
        """Walk every record of ``walk``'s shard (``count`` samples) its book does not know yet, once a book, so
        that it knows them all: each found and checked as a window's are (:meth:`read`), a window's worth of
        records at a time, none gathered from.

        A reader of another share each epoch (a persistent DataLoader worker) fills its book over many epochs,
        each walking the records it meets for the first time; learned whole in its second pass, every later one
        is a lookup (:meth:`read_known`). Only for a walk without checksums (they would be computed for nothing).
        """
        book = book_of(walk)
        assert book is not None
        book.learned_all = True
        k = self.layout.rows
        at_once = max(1, self._capacity // self.layout.length) if self.joined else PENDING_VIEWS  # a window's
        unknown = np.flatnonzero(book.addresses == 0)
        breaks = np.flatnonzero(np.diff(unknown) != 1) + 1
        for run in np.split(unknown, breaks) if len(unknown) else []:
            for first in range(int(run[0]), int(run[-1]) + 1, at_once):
                stop = min(int(run[-1]) + 1, first + at_once)
                self.read([(walk, count, first * k, min(stop * k, count))])

    def learns_all(self, walk: Walk, this_pass: object) -> bool:
        """True when ``walk``'s book should learn every record (:meth:`learn_all`) in ``this_pass`` (a token of the
        caller's pass over the set): records kept in books, no checksums, a book (not an empty one) that has not
        learned them all yet, made by an earlier pass of this process. A process that reads once (a DataLoader
        worker that is not persistent, a one-epoch job) never pays for records it will not read."""
        book = book_of(walk) if self._books and not walk.checks else None
        if book is None or book.learned_all or not len(book.addresses):
            return False
        if book.first_pass is None:
            book.first_pass = this_pass
        return book.first_pass is not this_pass

    def read_records(self, parts: Sequence[tuple[Walk, int, np.ndarray]]) -> FixedWindow:
        """The window holding whole records: per part (an open walk, samples in its shard, sorted record indices).

        Records are looked up by key (:meth:`Walk.records_at`) and held in the
        order given, part after part: record ``j`` of the window is the j-th index given.
        """
        build = _WindowBuilder(self.layout, self._buffer())
        for walk, count, records in parts:
            if not len(records):
                continue
            values = walk.records_at(records)
            breaks = np.flatnonzero(np.diff(records) != 1) + 1
            bounds = [0, *breaks.tolist(), len(records)]
            for a, e in itertools.pairwise(bounds):  # consecutive records: one piece (the builder names each)
                build.add(int(records[a]), values[a:e], count, walk.path)
        window = build.finish()
        self._recycled.append((window.buffer, weakref.ref(window)))
        return window

    def _buffer(self) -> np.ndarray:
        # reuse the storage of a window nobody holds any more: no fresh pages to fault in
        for i, (buffer, window) in enumerate(self._recycled):
            if window() is None:
                del self._recycled[i]
                return buffer
        return np.empty(self._capacity, np.uint8)


def _looked_up(walk: Walk, records: np.ndarray) -> np.ndarray | None:
    """The addresses ``walk``'s book holds for ``records`` (0: not known), or None where it has no book or the
    records run past it (an empty book)."""
    book = book_of(walk)
    if book is None or (len(records) and int(records.max()) >= len(book.addresses)):
        return None
    addresses: np.ndarray = book.addresses[records]
    return addresses


def _copy_records(mapped: Mapped, length: int, buffer: np.ndarray) -> tuple[np.ndarray, None, np.ndarray]:
    """The records ``mapped`` locates (``length`` bytes each) copied into ``buffer`` (grown if short), in one
    call: ``(joined rows, None, the buffer)``, :class:`FixedWindow`'s arguments for a joined window."""
    n = len(mapped.offsets)
    if n * length > len(buffer):
        buffer = np.empty(max(n * length, 2 * len(buffer)), np.uint8)
    joined = mapped.copy(mapped.offsets, length, buffer[: n * length].reshape(n, length))
    return joined, None, buffer


def _found_window(pieces: Sequence[Piece], layout: FixedLayout, known: Booked) -> tuple[Mapped, list[int]]:
    """Where every record of ``pieces`` lies (row after row, as :class:`Mapped`) and each piece's shift (its first
    record's row less its index), when their walks' address books know them all (found and checked on an
    earlier pass: ``address_book``; ``known``, every address non-zero).

    A few NumPy calls for the whole window, however many pieces it has. Each walk is told of its records
    (``Walk.found``): they count as read, and a walk with checksums checks them against their stored CRC-32s.
    """
    length = layout.length
    mapped = Mapped([], known.addresses, length)
    checks = any(walk.checks for walk, _, _, _ in pieces)
    checked = checks and matches_stored_crcs(known, length)  # else each piece's records checked by its walk
    views = views_at(known.addresses, length) if checks and not checked else []  # for the walks' checks
    row0s, firsts = known.row0s, known.firsts
    for (walk, _, _, _), row0, first, n in zip(pieces, row0s.tolist(), firsts.tolist(), known.counts.tolist()):
        values = views[row0 : row0 + n] if walk.checks and not checked else None
        walk.found(first, n, values, checked=checked)
    return mapped, (row0s - firsts).tolist()


def matches_stored_crcs(known: Booked, length: int) -> bool:
    """True when every record ``known`` locates (every address known, ``length`` bytes each) matches its stored
    CRC-32: each computed where it lies in LMDB's map, one call a record, and all compared in one NumPy call.

    False where one differs, or where a walk does not hold its records' CRC-32s in memory (``Walk.record_crcs``:
    blocks of several records) or defers its checks to a helper: the caller then has each walk check its pieces
    the usual way, which names the record at fault. A pass over a piece at a time cost about 40 us a piece of
    bookkeeping (small images packed 25 a record, an epoch 1.6x one without checks).
    """
    expected = known.stored_crcs() if all(walk.deferred is None for walk in known.walks) else None
    if expected is None:
        return False
    actual = np.fromiter(map(crc32, views_at(known.addresses, length)), np.uint32, len(expected))
    return bool(np.array_equal(actual, expected))


def _add_known(
    build: _WindowBuilder, pieces: Sequence[Piece], known: Booked, whole: Sequence[bool], shifts: list[int]
) -> None:
    """Add to ``build`` the pieces whose records the books know (``whole``), without a walk: each walk is told of
    them (``Walk.found``, with their values where it checks checksums); sets their ``shifts``."""
    length = build.layout.length
    row0s, firsts, counts = known.row0s.tolist(), known.firsts.tolist(), known.counts.tolist()
    for i in [i for i, w in enumerate(whole) if w]:
        walk, count, _, _ = pieces[i]
        addresses = known.addresses[row0s[i] : row0s[i] + counts[i]]
        values = views_at(addresses, length) if walk.checks else None
        walk.found(firsts[i], counts[i], values)
        shifts[i] = build.add_known(firsts[i], addresses, count, walk.path) - firsts[i]


class _WindowBuilder:
    """Collects whole records for one window and checks them against the layout.

    Records read from the map are kept as their addresses and lengths only,
    read (:func:`view_addresses`) for up to :data:`PENDING_VIEWS` of them at once:
    a piece of the block shuffle is a few records, and one call a piece cost
    about 50 us, a third of reading a window of small images packed 25 to a record.
    No per-record Python object outlives those few thousand records, so a window
    adds little for the garbage collector to walk. Records of a compressed set are decompressed one by one into a
    preallocated buffer. A record of the wrong length, the short final chunk of a
    shard, or one whose header bytes differ from the template is replaced by its
    checked canonical encoding.
    """

    def __init__(self, layout: FixedLayout, buffer: np.ndarray) -> None:
        self.layout = layout
        self.joined = joins(layout)
        self.buffer = buffer
        self.addresses: list[np.ndarray] = []  # per piece: where each record lies (read from the map)
        self.lengths: list[np.ndarray] = []
        #: per piece: (first row, first record index, record count, samples in its shard, its file)
        self.pieces: list[tuple[int, int, int, int, str]] = []
        #: per piece walked whose records are kept in a book once checked: (first row, first record, count, book,
        #: their addresses: None for views kept until :meth:`finish`)
        self.learning: list[tuple[int, int, int, AddressBook, np.ndarray | None]] = []
        self.held = 0  # records held
        self.pending: list[Any] = []  # views of the map whose addresses are not read yet (the last rows held)
        self.odd: dict[int, bytes] = {}  # row -> original value of a record of the wrong length
        #: joined windows: (first row, addresses) of records a book knows, copied from the map at :meth:`finish`
        self.known: list[tuple[int, np.ndarray]] = []

    def add(self, first: int, values: list[Any], count: int, path: str, book: AddressBook | None = None) -> int:
        """Append the values of records first, first+1, ... of a shard; returns the row of the first one.

        ``book`` (records read from the map): where the records that pass the checks are remembered.
        """
        row0 = self.held
        n = len(values)
        if self.joined:
            self._copy_in(values, row0)
            if book is not None and n:  # where the views lay (they die here)
                self.learning.append((row0, first, n, book, view_addresses(values)[0]))
        else:
            self.pending.extend(values)
            if book is not None:
                self.learning.append((row0, first, n, book, None))
        self.pieces.append((row0, first, n, count, path))
        self.held += n
        if len(self.pending) >= PENDING_VIEWS:
            self._locate_pending()
        return row0

    def _locate_pending(self) -> None:
        """Read the addresses and lengths of the pending views (the last rows held) in one call."""
        values, self.pending = self.pending, []
        if not values:
            return
        row0 = self.held - len(values)
        addresses, lengths = view_addresses(values)
        for i in np.flatnonzero(lengths != self.layout.length).tolist():
            self.odd[row0 + i] = bytes(values[i])
        self.addresses.append(addresses)
        self.lengths.append(lengths)

    def add_known(self, first: int, addresses: np.ndarray, count: int, path: str) -> int:
        """Append records first, first+1, ... of a shard that an address book knows (found and checked on an
        earlier pass) at ``addresses``, without a walk; returns the row of the first one."""
        row0 = self.held
        n = len(addresses)
        if self.joined:
            self._grow(row0 + n)
            self.known.append((row0, addresses))
        else:
            self._locate_pending()  # the views before these rows
            self.addresses.append(addresses)
            self.lengths.append(np.full(n, self.layout.length, np.int64))
        self.pieces.append((row0, first, n, count, path))
        self.held += n
        return row0

    def _grow(self, rows: int) -> None:
        """Make the buffer hold at least ``rows`` records, keeping those held."""
        length = self.layout.length
        if rows * length > len(self.buffer):
            # at least doubled: a window of many short pieces (StreamDataset's runs of frames in
            # records of many samples) grew it piece by piece, copying it whole each time (quadratic)
            grown = np.empty(max(rows * length, 2 * len(self.buffer)), np.uint8)
            grown[: self.held * length] = self.buffer[: self.held * length]
            self.buffer = grown

    def _copy_known(self, joined: np.ndarray) -> None:
        """Copy the records the books know into their rows of ``joined``, from the map in one call."""
        if not self.known:
            return
        rows = np.concatenate([np.arange(row0, row0 + len(a)) for row0, a in self.known])
        mapped = Mapped([], np.concatenate([a for _, a in self.known]), self.layout.length)
        if int(rows[-1]) - int(rows[0]) == len(rows) - 1:  # one run of rows (added after the walked ones)
            mapped.copy(mapped.offsets, self.layout.length, joined[int(rows[0]) : int(rows[-1]) + 1])
        else:
            joined[rows] = mapped.copy(mapped.offsets, self.layout.length, np.empty_like(joined[rows]))

    def _copy_in(self, values: list[Any], row0: int) -> None:
        length = self.layout.length
        n = len(values)
        self._grow(row0 + n)
        out = self.buffer.data
        pos = row0 * length
        expand = self.layout.expander  # compressed fields: decompressed straight into the slot
        for i, value in enumerate(values):
            try:
                if expand is None:
                    out[pos : pos + length] = value
                else:
                    expand(value, out[pos : pos + length])
            except ValueError:  # wrong length: keep it aside for the checked decoder
                self.odd[row0 + i] = bytes(value)
            pos += length

    def _piece_of(self, row: int) -> tuple[int, int, str]:
        """(record index, samples in its shard, its file) of the record held at ``row``."""
        for row0, first, n, count, path in self.pieces:
            if row0 <= row < row0 + n:
                return first + row - row0, count, path
        raise AssertionError(f"row {row} is held by no piece of the window")  # an internal invariant

    def finish(self, before_decoding: Callable[[], None] | None = None) -> FixedWindow:
        """The window of the records added; ``before_decoding`` is called before any record is decoded."""
        self._locate_pending()  # before the records of the wrong length are known
        layout, k = self.layout, self.layout.rows
        suspects = set(self.odd)
        for row0, first, n, count, _ in self.pieces:
            partial = count // k if count % k else -1  # the shard's short final chunk, if any
            if first <= partial < first + n:
                suspects.add(row0 + partial - first)
        if self.joined:
            joined = np.frombuffer(self.buffer, np.uint8, count=self.held * layout.length)
            joined = joined.reshape(self.held, layout.length)
            self._copy_known(joined)
            bad = np.flatnonzero((joined[:, layout.header_cols] != layout.header).any(axis=1))
            suspects.update(int(r) for r in bad)
            self._learn(None, suspects)
            if suspects:
                if before_decoding is not None:
                    before_decoding()
                joined = joined.copy()
                for row in suspects:
                    joined[row] = np.frombuffer(self._canonical(row, self.odd.get(row, joined[row])), np.uint8)
            return FixedWindow(layout, joined, None, self.buffer)
        # records read from the map: every non-payload byte checked at once, over the map
        if not self.held:
            return FixedWindow(layout, None, [], self.buffer)
        addresses = np.concatenate(self.addresses)
        lengths = np.concatenate(self.lengths)
        mapped = Mapped([], addresses, layout.length)
        whole = np.flatnonzero(lengths == layout.length)  # only these are long enough to compare
        suspects.update(whole[mapped.differing(whole, layout.header_segments())].tolist())
        self._learn(addresses, suspects)
        if suspects:  # each replaced by its checked canonical encoding, gathered from where that lies
            if before_decoding is not None:
                before_decoding()
            kept: list[bytes] = []
            for row in sorted(suspects):
                original = self.odd.get(row) or ctypes.string_at(int(addresses[row]), int(lengths[row]))
                kept.append(self._canonical(row, original))
                addresses[row] = address_of(kept[-1])
            mapped = Mapped(kept, addresses, layout.length)
        return FixedWindow(layout, None, list(mapped.views), self.buffer, mapped)

    def _learn(self, addresses: np.ndarray | None, suspects: set[int]) -> None:
        """Keep where the records that passed every check lie in their books (``addresses``: of every row held,
        for pieces whose views were kept), for later passes; a suspect is not kept."""
        for row0, first, n, book, found in self.learning:
            if found is None:
                assert addresses is not None  # views kept: the mapped path's rows
                found = addresses[row0 : row0 + n]
            checked = found.copy()
            for row in suspects:
                if row0 <= row < row0 + n:
                    checked[row - row0] = 0
            book.learn(first, checked)

    def _canonical(self, row: int, value: Any) -> bytes:
        record, count, path = self._piece_of(row)
        rows = min(self.layout.rows, count - record * self.layout.rows)
        data = value.tobytes() if isinstance(value, (np.ndarray, memoryview)) else value
        return self.layout.canonical(data, record, rows, f"{path}: record {record}")
