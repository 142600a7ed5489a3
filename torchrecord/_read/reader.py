"""One reader's share of an epoch, read window by window, with its position as plain state.

A :class:`ShareReader` is given the runs of sample indices that one reader
(one DataLoader worker of one rank) visits this epoch, and who it is (seed,
epoch, rank, worker). It cuts that share into windows (``torchrecord._order.windows``),
reads each window through the cursor walk, permutes it on its own, and hands
out consecutive chunks of the permuted sequence, starting from any position.

Two decoding paths give the same samples in the same order:

* fixed layout (every field numeric with a fixed shape): a chunk is a list of
  typed column arrays [B, ...], one per schema field (``torchrecord._store.fastread``);
* any other schema: a chunk is a list of decoded samples; the window holds the
  stored bytes and each sample is decoded by protobuf only when it is handed out.

The module is about 600 lines: the window loop, the grouping of windows and the hand-out of
chunks share the reader's state and are read together.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from torchrecord._core import dtypes as _dtypes
from torchrecord._core.kinds import as_tensor, check_bools
from torchrecord._core.layout import FixedLayout
from torchrecord._core.wire import WireDecoder
from torchrecord._order import windows as _order
from torchrecord._order.share import Share
from torchrecord._read.orders_ahead import OrdersAhead, orders_ahead_pay
from torchrecord._read.shard_walks import LocalRun, ShardWalks
from torchrecord._store.advise import resident
from torchrecord._store.checks_ahead import one_ahead
from torchrecord._store.fastread import FixedWindowReader, checks_ahead_pay, gathers_from_map, read_as_views
from torchrecord._store.record_file import RecordFile
from torchrecord._store.record_set import RecordSet
from torchrecord._store.walk import record_runs
from torchrecord.errors import ArgumentError

__all__ = ["LocalRun", "ShareReader", "split_runs"]

Run = tuple[int, int]
#: ``places(rows, row_bytes, count)``: room for up to ``count`` chunks gathered together, and how many it holds
Places = Callable[[int, list[int], int], "tuple[list[np.ndarray], int] | None"]
#: Bytes of samples gathered in one call at most when several chunks are gathered at once
#: (:meth:`ShareReader._chunks_at_once`); each chunk is then a view of that gather.
GATHER_BYTES = 1 << 20
#: Consecutive windows of the fixed path are read together up to this many bytes of samples (at most
#: :data:`MAX_GROUP` of them): :meth:`ShareReader._groups`.
GROUP_BYTES = 1 << 20
#: The same for windows whose samples are gathered straight from LMDB's map (records not copied into a
#: window buffer, so a group holds no more memory than a window): small images packed 25 a record, windows
#: of 2,048 samples (6.3 MB), 0 workers, 100 epochs a run: 1 MiB (a window a group) 31.1-31.5 ms an epoch,
#: 16 MiB 30.2-31.0, 32 MiB 28.3-29.5, 64 MiB 27.7-29.4 (a /tmp script, runs alternating).
MAPPED_GROUP_BYTES = 64 << 20
MAX_GROUP = 16


class ShareReader:
    """Reads a :class:`Share` of a record set and yields chunks of its permuted sequence.

    Args:
        file: the record set.
        share: what to read.
        layout: the set's fixed layout, or None for the generic (protobuf) path.
        verify: check every record's CRC-32 as it is read.
        advise: ask the kernel to read each next window ahead (a background
            thread per shard, ``torchrecord._store.advise``); False for one-off reads
            made on a read-ahead thread (MixedDataset's sources), which must not
            wait for another thread of their own.
        allocate: where the fixed path gathers each chunk: ``allocate(rows, row_bytes)``
            gives one uint8 array [rows, b] per field (a DataLoader worker's
            shared-memory slot, ``torchrecord._read.slots.allocate``); None: fresh arrays.
        places: where whole chunks gathered several at once go (``allocate`` None):
            ``places(rows, row_bytes, count)`` gives uint8 arrays [n * rows, b] for n <= count chunks
            and n (a worker's bundle arena, ``torchrecord._read.ipc.arena_places``), or None for
            fresh arrays.
    """

    def __init__(
        self,
        file: RecordSet,
        share: Share,
        *,
        layout: FixedLayout | None,
        verify: bool = False,
        advise: bool = True,
        allocate: Callable[[int, list[int]], list[np.ndarray]] | None = None,
        places: Places | None = None,
    ) -> None:
        self.file, self.share, self.layout, self.verify = file, share, layout, verify
        self.advise = advise
        self.allocate = allocate
        self.places = places
        self.offsets = file.shard_offsets
        self.records_read = 0

    @property
    def fixed(self) -> bool:
        """True when chunks are typed column arrays (the fixed-layout path)."""
        return self.layout is not None

    def chunks(self, size: int, start: int = 0) -> Iterator[list[Any]]:
        """Consecutive chunks of ``size`` samples from position ``start`` (the last may be short).

        Only the windows at or after ``start``'s are read, and only the shards
        they need are opened (a sharded set's shard is closed after the last
        window that needs it).
        """
        for chunk, _ in self.indexed_chunks(size, start):
            yield chunk

    def indexed_chunks(
        self, size: int, start: int = 0, out: Sequence[np.ndarray | None] | None = None, *, tensors: bool = False
    ) -> Iterator[tuple[list[Any], np.ndarray]]:
        """Like :meth:`chunks`, each chunk with the set's sample index of each of its samples (int64).

        The indices let an error raised while transforming a sample name it.
        ``out`` (fixed path only: one C-contiguous uint8 array [share total,
        sample bytes] per field, None to leave a field out) receives every chunk
        in its rows, in place of fresh arrays; the chunks are views of it (None
        for the fields left out). :func:`torchrecord.load` reads into its result so.
        ``tensors`` (fixed path): chunks gathered several at once come as views of
        one tensor a field (``as_tensor``: one conversion a gather, not one a chunk),
        for a caller that makes tensors of them anyway (``stack_columns``); other
        chunks stay typed arrays.
        """
        if out is not None and self.layout is None:
            raise ArgumentError("out= needs the fixed-layout path")
        share = self.share
        total = share.total
        if start >= total:
            return
        first_window = start // share.window
        window = share.window
        window_runs = _order.window_runs(share.runs, window, first_window)
        window_plans = [split_runs(runs, self.offsets) for runs in window_runs]
        groups = self._groups(window_plans)
        plan = [[piece for pieces in window_plans[a:b] for piece in pieces] for a, b in groups]
        # zero-copy views only pay for long records (fastread.read_as_views): for short ones, bytes objects are
        # cheaper to make (and untracked by the garbage collector; see fastread.JOIN_LIMIT). Compressed sets:
        # views, decompressed straight from the map into the window. Records the wire path reads are views too
        layout = self.layout
        if layout is not None:
            buffers = read_as_views(layout)
        else:
            buffers = WireDecoder.of(self.file.schema) is not None
        # checksums of long samples from the map: each window read one ahead, its CRC-32s computed on a
        # helper thread while the window before is handed out (torchrecord._store.checks_ahead); others
        # are checked as each window is found
        ahead = int(self.verify and layout is not None and checks_ahead_pay(layout))
        walks = ShardWalks(self.file, plan, verify=self.verify, buffers=buffers, defer_checks=bool(ahead))
        orders = self._orders(first_window, groups, window_runs, total - start)
        try:
            if plan and self.advise:
                for pieces in plan[: 1 + ahead]:
                    walks.advise(pieces)
            windows = self._fixed_windows(walks, orders) if self.layout is not None else self._generic_windows(walks)
            position = start  # the position of the chunk being assembled
            chunk = _Chunk(self, min(size, total - position), out, position)
            skip = start - first_window * share.window
            # chunks one window serves whole, gathered into fresh arrays (no out=, no slot): _whole_chunks
            plain = out is None and self.allocate is None and (layout is None or self._most_at_once(size) < 2)
            takers: Iterator[_Taken] = (
                windows(first_window + a, pieces, [_indices(runs) for runs in window_runs[a:b]], g)
                for g, ((a, b), pieces) in enumerate(zip(groups, plan))
            )
            if ahead:
                takers = one_ahead(takers)
            for i, taker in enumerate(takers):
                # the kernel reads the next window while this one is handed out (asked after this
                # window's walk, so its pages do not queue behind the next window's)
                if self.advise:
                    following = i + 1 + ahead
                    walks.advise(plan[following] if following < len(plan) else [])
                if skip:
                    taker.offset, skip = skip, 0
                chunk, position = yield from self._hand_out(taker, chunk, position, size, total, out, plain, tensors)
                walks.done(i)
            if chunk.held:  # cannot happen: the windows cover the share exactly
                yield chunk.result()
        finally:
            if isinstance(orders, OrdersAhead):
                orders.close()
            self.records_read += walks.close()

    def _hand_out(
        self,
        taker: _Taken,
        chunk: _Chunk,
        position: int,
        size: int,
        total: int,
        out: Sequence[np.ndarray | None] | None,
        plain: bool,
        tensors: bool,
    ) -> Generator[tuple[list[Any], np.ndarray], None, tuple[_Chunk, int]]:
        """Hand out one window's samples (``taker``) as chunks of ``size`` (of a share of ``total``), from
        ``chunk``, the chunk being assembled at share position ``position``: whole chunks of the window at once
        (``plain``: :meth:`_whole_chunks`; small ones several at once), a chunk that spans windows sample by
        sample. Returns the chunk being assembled after the window, and its position."""
        while taker.remaining:
            whole = min(taker.remaining, total - position) // size if plain and not chunk.held else 0
            if whole:  # whole chunks of this window, one after another
                yield from self._whole_chunks(taker, size, whole)
                position += whole * size
                chunk = _Chunk(self, min(size, total - position), out, position)
                continue
            several = self._chunks_at_once(chunk, taker, size)
            if several > 1:  # whole chunks of this window, gathered and typed together
                arrays, indices, several = self._take_several(taker, several, size)
                yield from self._split(self.typed(arrays), indices, size, tensors)
                position += several * size
                chunk = _Chunk(self, min(size, total - position), out, position)
                continue
            chunk.take(taker)
            if chunk.full:
                yield chunk.result()
                position += chunk.n
                chunk = _Chunk(self, min(size, total - position), out, position)
        return chunk, position

    def _whole_chunks(self, taker: _Taken, size: int, count: int) -> Iterator[tuple[list[Any], np.ndarray]]:
        """The next ``count`` chunks of ``size`` samples of ``taker``, each gathered into fresh arrays (typed
        columns on the fixed path, typed as they are gathered where the window can: ``_Taken.typed``)."""
        if taker.typed is not None:
            for _ in range(count):
                yield taker.take_typed(size)
            return
        for _ in range(count):
            arrays, indices = taker.take(size)
            yield (self.typed(arrays) if self.layout is not None else arrays), indices

    def _take_several(self, taker: _Taken, several: int, size: int) -> tuple[list[Any], np.ndarray, int]:
        """The next ``several`` whole chunks of ``taker`` gathered together (into :attr:`places` where it has room,
        perhaps for fewer): their arrays, their indices and how many chunks they hold."""
        placed = None
        if self.places is not None:
            assert self.layout is not None
            placed = self.places(size, list(self.layout.sample_bytes), several)
        if placed is None:
            arrays, indices = taker.take(several * size)
            return arrays, indices, several
        out, several = placed
        return list(out), taker.take_into(several * size, out, 0), several

    def _split(
        self, columns: list[Any], indices: np.ndarray, size: int, tensors: bool
    ) -> Iterator[tuple[list[Any], np.ndarray]]:
        """Typed columns of several whole chunks gathered together, cut into chunks of ``size``: views of the
        arrays, or (``tensors``) of one tensor a field, split in one call a field."""
        if tensors:
            assert self.layout is not None
            parts = [torch.split(as_tensor(c, f.dtype), size) for c, f in zip(columns, self.layout.fields)]
            for j, a in enumerate(range(0, len(indices), size)):
                yield [part[j] for part in parts], indices[a : a + size]
            return
        for a in range(0, len(indices), size):
            yield [c[a : a + size] for c in columns], indices[a : a + size]

    def _orders(
        self, first_window: int, groups: Sequence[Run], window_runs: Sequence[Sequence[Run]], samples: int
    ) -> Callable[[int], np.ndarray | None]:
        """The fixed path's order of each group of windows, by group (from 0): made on a helper thread ahead of
        the reader where that pays (``torchrecord._read.orders_ahead``), else when asked for."""
        starts = [first_window + a for a, _ in groups]
        sizes = [[sum(b - a for a, b in runs) for runs in window_runs[a:b]] for a, b in groups]

        def make(g: int) -> np.ndarray | None:
            return self._group_order(starts[g], sizes[g])

        layout = self.layout
        if layout is not None and self.share.shuffle and orders_ahead_pay(samples, sum(layout.sample_bytes)):
            return OrdersAhead(make, len(groups))
        return make

    def _groups(self, plans: Sequence[Sequence[LocalRun]]) -> list[Run]:
        """The windows read together, as ranges [a, b) of ``plans`` (the pieces of each window from the first
        one read).

        On the fixed-layout path, consecutive windows holding at most :data:`GROUP_BYTES` of samples together
        (:data:`MAPPED_GROUP_BYTES` where samples are gathered straight from LMDB's map) are read as one: one
        walk of their pieces, one check of their records, one gather a field for several batches. A window's
        fixed costs (building and checking it, about 0.3 ms; looking its records up, about 0.1 ms) then no
        longer dominate small windows of tiny samples (2,048 samples of 68 bytes: 8 batches), nor windows of a
        few dozen records of small images. Each window is still permuted on its
        own, so the order is the same as window by window. A group of a sharded set needs no shard its first
        window does not, so no more shards are open (or held in a remote set's cache) at once than window by
        window. Other paths: one window at a time.
        """
        most = self._windows_per_group()
        sharded = self.file.num_shards > 1
        alone = self._read_alone(plans) if most > 1 else set()
        groups: list[Run] = []
        a = 0
        while a < len(plans):
            b = a + 1
            shards = {s for s, _, _ in plans[a]}
            while (
                b < len(plans)
                and b - a < most
                and (not sharded or {s for s, _, _ in plans[b]} <= shards)
                and a not in alone
                and b not in alone
            ):
                b += 1
            groups.append((a, b))
            a = b
        return groups

    def _read_alone(self, plans: Sequence[Sequence[LocalRun]]) -> set[int]:
        """The windows of ``plans`` to read as a group of their own: on the path that gathers from LMDB's map,
        those holding a shard's short last record (fewer samples than the others), which a second pass cannot
        look up in the address books (``FixedWindowReader.read_known``): read with the windows around it, it
        would send them all down the slower path every epoch."""
        layout = self.layout
        if layout is None or not gathers_from_map(layout) or layout.rows < 2:
            return set()
        counts = np.diff(self.offsets).tolist()
        return {
            w for w, pieces in enumerate(plans) if any(b == counts[s] and counts[s] % layout.rows for s, _, b in pieces)
        }

    def _windows_per_group(self) -> int:
        """Windows read together at most (:meth:`_groups`): 1 but on the fixed-layout path."""
        layout, share = self.layout, self.share
        if layout is None:
            return 1
        window_bytes = max(1, min(share.window, share.total) * layout.length // max(1, layout.rows))
        most = MAPPED_GROUP_BYTES if gathers_from_map(layout) else GROUP_BYTES
        return max(1, min(MAX_GROUP, most // window_bytes))

    def _chunks_at_once(self, chunk: _Chunk, taker: _Taken, size: int) -> int:
        """How many whole chunks to gather from ``taker`` in one call per field (0 or 1: one as usual).

        Several when chunks are small (tiny samples): one gather and one typing for all of them, then each
        chunk a slice, saves the per-chunk Python that dominates them. Only where no ``out=`` and no slot a
        chunk is asked for (a worker's bundle arena may take them: ``places``), from a chunk not begun, and at
        most :data:`GATHER_BYTES` at once, so that a batch kept alive keeps little else alive with it.
        """
        if self.layout is None or chunk.held or chunk.n != size or chunk.out is not None or self.allocate is not None:
            return 0
        return min(taker.remaining // size, self._most_at_once(size))

    def _most_at_once(self, size: int) -> int:
        """Whole chunks of ``size`` samples that :data:`GATHER_BYTES` holds (fixed path)."""
        layout = self.layout
        assert layout is not None
        return GATHER_BYTES // max(1, size * layout.length // layout.rows)

    # -- the two paths --------------------------------------------------------
    def _fixed_windows(self, walks: ShardWalks, orders: Callable[[int], np.ndarray | None]) -> Any:
        layout = self.layout
        assert layout is not None
        # sized by the samples this reader will hold at once, never by a claim (a batch_size of 10**7
        # on a set of 2,000 samples makes a window of 10**7 positions, of which 2,000 are filled)
        reader = FixedWindowReader(layout, min(self.share.window * self._windows_per_group(), self.share.total))

        learned: set[int] = set()  # shards whose books were offered every record
        this_pass = object()
        learns = self._learns_whole_shards()

        def window(j: int, pieces: Sequence[LocalRun], parts: Sequence[np.ndarray], g: int) -> _Taken:
            indices = parts[0] if len(parts) == 1 else np.concatenate(parts)
            for s in {s for s, _, _ in pieces} - learned if learns else ():
                learned.add(s)
                if reader.learns_all(walks.walk(s), this_pass) and resident(walks.file(s).path):
                    reader.learn_all(walks.walk(s), walks.count(s))
            walked = [(walks.walk(s), walks.count(s), a, b) for s, a, b in pieces]
            known = reader.read_known(walked, self._in_shards(pieces, indices)) if reader.looks_up else None
            win, rec, row = known if known is not None else reader.read(walked, walks.settle_deferred)
            order = orders(g)  # the group's windows from window j, each permuted on its own
            if order is not None:
                rec, row, indices = rec[order], row[order], indices[order]
            checks = walks.checks_ahead(rec)  # None unless its checksums are deferred (computed on a helper)
            places = win.places(rec, row)  # a window read from the map: where its samples lie, once

            def gather(sel: slice, out: Sequence[np.ndarray | None] | None = None, at: int = 0) -> list[Any]:
                if places is not None:
                    got = win.gather_at(places, sel, out, at)
                else:
                    got = win.gather(rec[sel], row[sel], out, at)
                if checks is not None:  # copied while the helper computed: handed out only once the CRC-32s match
                    checks.settle(rec[sel])
                return got

            def typed(sel: slice) -> list[Any]:  # a window from the map, no checksums, no bools: typed at once
                assert places is not None
                return win.gather_typed(places, sel, self._shapes)

            plain = places is not None and checks is None and not self._has_bools
            return _Taken(len(rec), gather, indices, typed if plain else None)

        return window

    def _learns_whole_shards(self) -> bool:
        """Whether the address books learn every record of a shard in this process's second pass over it
        (``FixedWindowReader.learns_all``): where this reader reads another share of the set each epoch (a
        DataLoader worker, or a rank, reading shuffled). Only shards found in the page cache
        (``advise.resident``): a shard read from the disk would be read twice."""
        return self.share.shuffle and self.share.total < int(self.offsets[-1])

    def _in_shards(self, pieces: Sequence[LocalRun], indices: np.ndarray) -> np.ndarray:
        """``indices`` (the set's, of ``pieces``' samples in order) as indices in each sample's shard."""
        shards = {s for s, _, _ in pieces}
        if len(shards) <= 1:
            first = int(self.offsets[pieces[0][0]]) if pieces else 0
            return indices - first if first else indices
        starts = self.offsets[[s for s, _, _ in pieces]]
        local: np.ndarray = indices - np.repeat(starts, [b - a for _, a, b in pieces])
        return local

    def _group_order(self, j: int, sizes: Sequence[int]) -> np.ndarray | None:
        """The order of a group of windows from window ``j`` (``sizes`` positions each): each window's own
        permutation, shifted to where the window starts in the group; None to keep run order."""
        orders: list[np.ndarray] = []
        at = 0
        for i, n in enumerate(sizes):
            order = self.share.order(j + i, n)
            if order is None:
                return None
            orders.append(order + at if at else order)
            at += n
        return orders[0] if len(orders) == 1 else np.concatenate(orders)

    def _generic_windows(self, walks: ShardWalks) -> Any:
        k = self.file.samples_per_record

        def window(j: int, pieces: Sequence[LocalRun], parts: Sequence[np.ndarray], g: int) -> _Taken:
            (indices,) = parts  # one window at a time (ShareReader._groups)
            items: list[tuple[RecordFile, int, Any]] = []
            for s, start, stop in pieces:
                walk, file = walks.walk(s), walks.file(s)
                if k == 1:
                    for first, values in walk.pieces(record_runs([(start, stop)], 1)):
                        items.extend(zip([file] * len(values), range(first, first + len(values)), values))
                    continue
                for first, values in walk.pieces(record_runs([(start, stop)], k)):
                    for record, value in zip(range(first, first + len(values)), values):
                        for i, sample in enumerate(file.decode_record(value, record)):
                            if start <= record * k + i < stop:
                                items.append((file, -1, sample))
            order = self.share.order(j, len(items))
            if order is not None:
                items = [items[i] for i in order.tolist()]
                indices = indices[order]

            def decode(sel: slice) -> list[Any]:
                if k == 1:
                    return [file.decode(value, index) for file, index, value in items[sel]]
                return [sample for _, _, sample in items[sel]]

            return _Taken(len(items), decode, indices)

        return window

    def typed(self, arrays: Sequence[np.ndarray | None]) -> list[Any]:
        """The fixed path's gathered uint8 arrays as typed columns [B, ...] (bool bytes checked).

        A None (a field left out of an ``out=`` read) stays None.
        """
        layout = self.layout
        assert layout is not None
        typed = [
            None if a is None else a.view(dt).reshape((len(a), *shape)) for a, (shape, dt) in zip(arrays, self._shapes)
        ]
        if self._has_bools:
            kept = [(a, f) for a, f in zip(typed, layout.fields) if a is not None]
            check_bools([a for a, _ in kept], [f for _, f in kept], self.file.path)
        return typed

    @functools.cached_property
    def _shapes(self) -> list[tuple[tuple[int, ...], Any]]:
        """Each field's sample shape and NumPy dtype (worked out once: :meth:`typed` runs once a chunk)."""
        assert self.layout is not None
        return [(tuple(int(d or 0) for d in f.shape), _dtypes.by_name(f.dtype).numpy) for f in self.layout.fields]

    @functools.cached_property
    def _has_bools(self) -> bool:
        assert self.layout is not None
        return any(f.dtype == "bool" for f in self.layout.fields)


class _Chunk:
    """One chunk being assembled from the takes of one or more windows.

    On the fixed path a chunk that one window serves whole is gathered into fresh
    arrays; one that spans windows is gathered in place into arrays made for the
    whole chunk, so every sample is copied once (no joining copy).
    """

    def __init__(
        self, reader: ShareReader, n: int, dest: Sequence[np.ndarray | None] | None = None, position: int = 0
    ) -> None:
        self.reader, self.n = reader, n
        self.held = 0
        self.parts: list[Any] = []
        self.indices: list[np.ndarray] = []
        # the rows of the caller's arrays this chunk fills (ShareReader.indexed_chunks's out=)
        self.out: list[Any] | None = (
            None if dest is None else [None if d is None else d[position : position + n] for d in dest]
        )

    @property
    def full(self) -> bool:
        return self.held >= self.n

    def take(self, taker: _Taken) -> None:
        """Take as many samples from ``taker`` as this chunk still needs."""
        n = min(self.n - self.held, taker.remaining)
        layout, allocate = self.reader.layout, self.reader.allocate
        if layout is None or (self.held == 0 and n == self.n and self.out is None and allocate is None):
            part, indices = taker.take(n)
            self.parts.append(part)
        else:
            if self.out is None:
                sizes = list(layout.sample_bytes)
                if allocate is not None:
                    self.out = list(allocate(self.n, sizes))
                else:
                    self.out = [np.empty((self.n, size), np.uint8) for size in sizes]
            indices = taker.take_into(n, self.out, self.held)
        self.indices.append(indices)
        self.held += n

    def result(self) -> tuple[list[Any], np.ndarray]:
        """The chunk (typed columns, or decoded samples) and the sample index of each sample."""
        indices = self.indices[0] if len(self.indices) == 1 else np.concatenate(self.indices)
        if self.reader.layout is not None:
            if self.out is not None:
                arrays = [None if a is None else a[: self.held] for a in self.out]
            else:
                arrays = self.parts[0]
            return self.reader.typed(arrays), indices
        return [sample for part in self.parts for sample in part], indices


def _indices(runs: Sequence[Run]) -> np.ndarray:
    """The sample indices of runs, in run order."""
    if not runs:
        return np.zeros(0, np.int64)
    if len(runs) == 1:
        return np.arange(runs[0][0], runs[0][1], dtype=np.int64)
    # an arange a run: on the few runs of a window, faster than one vectorized build (4.7 against 15.9 us on
    # two runs; about even at 20 runs)
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in runs])


def split_runs(runs: Sequence[Run], offsets: np.ndarray) -> list[LocalRun]:
    """Runs of global sample indices as (shard, start, stop) in shard indices, cut at shard bounds."""
    out: list[LocalRun] = []
    bounds = offsets.tolist()
    for a, b in runs:
        while a < b:
            s = bisect.bisect_right(bounds, a) - 1
            e = min(b, bounds[s + 1])
            out.append((s, a - bounds[s], e - bounds[s]))
            a = e
    return out


class _Taken:
    """A permuted window handed out front to back: ``take(n)`` gives the next n samples and their indices."""

    def __init__(
        self, n: int, get: Any, indices: np.ndarray, typed: Callable[[slice], list[Any]] | None = None
    ) -> None:
        self.n, self.get, self.indices, self.offset = n, get, indices, 0
        #: where the window can: its samples gathered as typed columns (the fixed path's ``typed`` of ``get``)
        self.typed = typed

    @property
    def remaining(self) -> int:
        return self.n - self.offset

    def take(self, n: int) -> tuple[Any, np.ndarray]:
        sel = slice(self.offset, self.offset + n)
        self.offset += n
        return self.get(sel), self.indices[sel]

    def take_typed(self, n: int) -> tuple[list[Any], np.ndarray]:
        """:meth:`take` of a window that types as it gathers (:attr:`typed`): typed columns and indices."""
        assert self.typed is not None
        sel = slice(self.offset, self.offset + n)
        self.offset += n
        return self.typed(sel), self.indices[sel]

    def take_into(self, n: int, out: Sequence[np.ndarray | None], at: int) -> np.ndarray:
        """Gather the next n samples into ``out`` from row ``at`` (fixed path); returns their indices."""
        sel = slice(self.offset, self.offset + n)
        self.offset += n
        self.get(sel, out, at)
        return self.indices[sel]
