"""Read a user's dataset in write order, optionally in parallel, one sample at a time.

Every sample comes out as ``(source_index, outcome, key)`` where outcome is either
the finished record bytes (fast encoder), the normalized sample (structure tree,
leaf signatures, leaf payloads) or the error the source raised for it, so the
writer can name the index or skip it; ``key`` is the sample's group key when
reading with ``key=`` (grouped sets), else None. Without a key function, runs of
fast-encoded samples of a map-style source come as one :class:`Encoded` batch.
"""

from __future__ import annotations

import copy
import inspect
import traceback
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from multiprocessing import reduction
from typing import Any

import numpy as np
import torch.utils.data

from torchrecord._core.codec import Payload, leaf_payload
from torchrecord._core.schema import LeafSignature
from torchrecord._core.structure import Tree, field_names, flatten
from torchrecord._write.fastwrite import Column, FastEncoder
from torchrecord.errors import SampleTypeError, SampleValueError, TorchRecordError

__all__ = [
    "COLUMNS_METHOD",
    "Encoded",
    "Failed",
    "Item",
    "KeyFunction",
    "Normalized",
    "Outcome",
    "Preparer",
    "add_note",
    "encoder_for",
    "failure",
    "is_map_style",
    "iterate_source",
    "normalize",
    "read_in_order",
]


@dataclass
class Normalized:
    """A sample split into its structure and storable leaves."""

    tree: Tree
    signatures: list[LeafSignature]
    payloads: list[Payload]


@dataclass
class Failed:
    """The source raised (or gave an unstorable sample) at this index.

    ``error`` is the exception itself, for the writer to chain (``raise ... from
    error``): in a DataLoader worker it carries its traceback as a note, since
    pickling drops the traceback; None when it cannot be pickled, and then
    ``detail`` (the formatted traceback) is all there is. ``invalid``: the
    library's own checks refused the sample (a value the format cannot store, no
    group key), so the writer raises that error, not a source failure.
    """

    message: str
    detail: str
    fatal: bool = False  # the source cannot go on (a generator that raised): never skippable
    error: BaseException | None = None
    invalid: bool = False


def normalize(sample: Any) -> Normalized:
    """Flatten a sample and normalize each leaf.

    TypeError (a leaf of a type that cannot be stored) or ValueError (values
    readers would refuse) name the field.
    """
    tree, leaves = flatten(sample)
    signatures: list[LeafSignature] = []
    payloads: list[Payload] = []
    for i, leaf in enumerate(leaves):
        try:
            signature, payload = leaf_payload(leaf)
        except (TypeError, ValueError) as exc:
            name = field_names(tree)[i]
            if leaf is None:
                raise SampleTypeError(
                    f"field {name!r} is None, which cannot be stored; give it a value in every sample "
                    "(0, '', an empty list...), or leave the field out of every sample"
                ) from None
            raise (SampleTypeError if isinstance(exc, TypeError) else SampleValueError)(
                f"field {name!r}: {exc}"
            ) from None
        signatures.append(signature)
        payloads.append(payload)
    return Normalized(tree, signatures, payloads)


Outcome = bytes | Normalized | Failed
#: The group key of a sample (grouped sets); raises for a sample without a usable key.
KeyFunction = Callable[[Any], Hashable]
#: (source index, outcome, group key or None)
Item = tuple[int, Outcome, Hashable]


def _prepare(sample: Any, encoder: FastEncoder | None) -> bytes | Normalized:
    """Encoded bytes straight from the fast encoder when the sample fits it, else normalized."""
    if encoder is not None:
        value = encoder.encode(sample)
        if value is not None:
            return value
    return normalize(sample)


def failure(exc: Exception, fatal: bool = False, invalid: bool = False) -> Failed:
    """A :class:`Failed` for ``exc``, being handled now (its traceback is the current one)."""
    detail = traceback.format_exc()
    return Failed(f"{type(exc).__name__}: {exc}", detail, fatal, _portable(exc, detail), invalid)


def _portable(exc: Exception, detail: str) -> BaseException | None:
    """``exc`` as it can travel from a DataLoader worker (its traceback as a note), or None if it cannot."""
    if torch.utils.data.get_worker_info() is None:
        return exc  # read in this process: the exception keeps its own traceback
    try:
        add_note(exc, f"(raised in a DataLoader worker of the write)\n{detail.rstrip()}")
        reduction.ForkingPickler.dumps(exc)  # it pickles as the worker's queue will pickle it,
        copy.deepcopy(exc)  # and rebuilds the way unpickling will (no bytes are ever loaded here)
    except Exception:  # an exception that does not pickle: the writer shows the formatted traceback
        return None
    return exc


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``: shown under the exception's traceback (Python 3.11+; kept, unshown, on 3.10)."""
    add = getattr(exc, "add_note", None)
    if add is not None:
        add(note)
    else:
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]


def _failed(index: int, exc: Exception, invalid: bool = False) -> Item:
    return index, failure(exc, invalid=invalid), None


def _attempt(dataset: Any, index: int, encoder: FastEncoder | None, key: KeyFunction | None = None) -> Item:
    try:
        sample = dataset[index]
    except Exception as exc:  # the user's code: any exception is reported with its index
        return _failed(index, exc)
    return _checked(index, sample, encoder, key)


def _checked(index: int, sample: Any, encoder: FastEncoder | None, key: KeyFunction | None) -> Item:
    """The sample's group key and encoding; a failure is the library's refusal, or the group_by function's."""
    try:
        group = key(sample) if key is not None else None
        return index, _prepare(sample, encoder), group
    except TorchRecordError as exc:  # the format cannot store it, or it has no group key
        return _failed(index, exc, invalid=True)
    except Exception as exc:  # a group_by function of the user's raised
        return _failed(index, exc)


class Preparer:
    """Turns pushed samples into items, building the fast encoder from the first good one.

    The encoder is built only from a sample whose key and normalization both
    succeeded, so it is always the sample that fixes the schema.
    """

    def __init__(self, fast: bool, key: KeyFunction | None = None) -> None:
        self._fast = fast
        self._key = key
        self._encoder: FastEncoder | None = None
        self._first = True

    def __call__(self, index: int, sample: Any) -> Item:
        item = _checked(index, sample, self._encoder, self._key)  # a failure: reported (or skipped)
        outcome = item[1]
        if isinstance(outcome, Failed):
            return item
        if self._first:
            self._first = False
            self._encoder = encoder_for(outcome, self._fast)
        return item


def encoder_for(outcome: Outcome, fast: bool) -> FastEncoder | None:
    """The fast encoder for samples like this first outcome (None if not eligible)."""
    if not fast or not isinstance(outcome, Normalized):
        return None
    return FastEncoder.build(outcome.tree, outcome.signatures)


def is_map_style(dataset: Any) -> bool:
    """True when the dataset has ``__len__`` and ``__getitem__`` (and is no iterator).

    A torch ``IterableDataset`` is never map-style, even with ``__len__``: it inherits
    a ``__getitem__`` that only raises.
    """
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return False
    return hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__") and not hasattr(dataset, "__next__")


@dataclass
class Encoded:
    """Consecutive samples that all fit the fast encoder, as one typed column [n, ...] per field.

    ``tree`` and ``signatures`` are the encoder's (the first sample's), so the
    writer can lay the columns out as records of any number of samples
    (``torchrecord._write.fastwrite.fill_records``).
    """

    columns: list[Column]
    tree: Tree
    signatures: list[LeafSignature]

    def __len__(self) -> int:
        return len(self.columns[0])


_BATCH = 64  # samples per fetch: one IPC message per batch with workers
#: ... or more, for small samples read as columns: up to this many bytes of samples per fetch
_BATCH_BYTES = 256 << 10
_MAX_BATCH = 4096
#: ... and, for samples with bytes or str fields (whose size is known from the first), at most this many bytes
_MAX_BATCH_BYTES = 16 << 20
_MAX_VAR_BATCH = 1024
#: The method of a source that reads many rows at once as columns (leaf order): ``source.<name>(indices)``
#: gives one stacked column per field (an array [n, ...], or a BytesColumn for bytes and str), or None
#: when it cannot; see :meth:`FastEncoder.stacked`.
COLUMNS_METHOD = "_torchrecord_columns"


class _Reorder(torch.utils.data.Dataset[Any]):
    """Batch b of the write order -> Encoded, or [(source index, outcome, key), ...]; runs in workers.

    Without a key, a batch is read as columns: straight from the arrays of a
    ``TensorDataset`` or an array/tensor source, else through the dataset's
    ``__getitems__`` (the batched protocol of torch datasets) or ``dataset[i]``
    per sample, then stacked per field (:meth:`FastEncoder.columns`). A batch
    holding any sample that does not fit is read again sample by sample, so
    exactly the bad ones are reported (or skipped).
    """

    def __init__(
        self,
        dataset: Any,
        order: np.ndarray,
        encoder: FastEncoder | None,
        key: KeyFunction | None,
        fast: bool = True,
        sample_bytes: int = 0,
    ) -> None:
        self.dataset = dataset
        self.order = order
        self.encoder = encoder
        self.key = key
        self.fast = fast  # single samples may come as finished record bytes
        self.batch = _BATCH
        if encoder is not None and key is None:
            per_sample = max(1, encoder.length, sample_bytes)
            self.batch = max(_BATCH, min(_MAX_BATCH, _BATCH_BYTES // per_sample))
            if encoder.layout is None:  # bytes or str fields: sized by the first sample, whose size may be no guide
                self.batch = max(_BATCH, min(_MAX_VAR_BATCH, _MAX_BATCH_BYTES // max(per_sample, 4096)))

    def __len__(self) -> int:
        return -(-len(self.order) // self.batch)

    def __getitem__(self, batch: int) -> Encoded | list[Item]:
        chosen = self.order[batch * self.batch : (batch + 1) * self.batch]
        indices = chosen.tolist()
        dataset, encoder = self.dataset, self.encoder
        single = encoder if self.fast else None
        if self.key is not None:  # grouped: every sample with its key
            return [_attempt(dataset, i, single, self.key) for i in indices]
        if encoder is not None:
            try:  # the common case: whole columns, no per-sample encoding
                columns = _stacked_source(dataset, chosen, encoder)
                if columns is None:
                    getitems = getattr(dataset, "__getitems__", None)
                    samples = getitems(indices) if getitems is not None else [dataset[i] for i in indices]
                    if len(samples) == len(indices):
                        columns = encoder.columns(samples)
                if columns is not None:
                    return Encoded(columns, encoder.tree, encoder.signatures)
            except Exception:
                pass  # redo sample by sample below, to report (or skip) exactly the bad ones
        return [_attempt(dataset, i, single) for i in indices]


def _stacked_source(dataset: Any, chosen: np.ndarray, encoder: FastEncoder) -> list[Column] | None:
    """The columns of a source that is already columns (TensorDataset, an array or a tensor, or a source
    with a :data:`COLUMNS_METHOD`), else None."""
    n = len(chosen)
    read_columns = getattr(dataset, COLUMNS_METHOD, None)
    if read_columns is not None:
        leaves = read_columns(chosen)
        return encoder.stacked(leaves, n) if leaves is not None else None
    if type(dataset) is torch.utils.data.TensorDataset and encoder.tree["t"] == "tuple":
        return encoder.stacked([_rows_of(t, chosen) for t in dataset.tensors], n)
    if encoder.tree["t"] == "leaf":
        if isinstance(dataset, np.ndarray):
            return encoder.stacked([dataset[chosen]], n)
        if isinstance(dataset, torch.Tensor):
            return encoder.stacked([_rows_of(dataset, chosen)], n)
    return None


def _rows_of(t: torch.Tensor, chosen: np.ndarray) -> torch.Tensor:
    """``t[chosen]`` (NumPy's indexing where it can: torch's is much slower on CPU for 2-d rows)."""
    if t.device.type == "cpu" and not t.requires_grad and t.dtype != torch.bfloat16:
        return torch.from_numpy(t.numpy()[chosen])
    return t[torch.from_numpy(chosen)]


def read_in_order(
    dataset: Any,
    order: np.ndarray,
    num_workers: int,
    mp_context: str | None = None,
    fast: bool = True,
    key: KeyFunction | None = None,
) -> Iterator[Item | Encoded]:
    """Yield ``(index, outcome, key)`` for ``dataset[i]`` for i in ``order``, in that order.

    The first sample is read here and builds the fast encoder. Without ``key``,
    the rest (read here or in workers) come as columns of many samples at a time
    (``Encoded``); samples read one by one come as finished record bytes when
    ``fast``, else normalized. ``key`` runs where the sample is read (in the
    workers too, so it must pickle under spawn).
    """
    if len(order) == 0:
        return
    item = _attempt(dataset, int(order[0]), None, key)
    yield item
    encoder = encoder_for(item[1], fast or key is None)
    reorder = _Reorder(dataset, order[1:], encoder, key, fast, _size(item[1]))
    batches: Iterable[Any]
    if num_workers <= 0:
        batches = (reorder[b] for b in range(len(reorder)))
    else:
        batches = torch.utils.data.DataLoader(
            reorder,
            batch_size=None,
            shuffle=False,
            num_workers=num_workers,
            multiprocessing_context=mp_context,
            prefetch_factor=4,
            collate_fn=_as_is,  # the default turns tuples (group keys) into lists, NumPy scalars into tensors
        )
    iterator: Iterator[Any] = iter(batches)
    try:
        for batch in iterator:
            if isinstance(batch, Encoded):
                yield batch
            else:
                yield from batch
    finally:
        # stop the reader workers when this generator is closed (an error, a stop), not at a later GC:
        # a traceback that holds this frame would otherwise keep them running
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


def _size(outcome: Outcome) -> int:
    """The payload bytes of a normalized sample (0 for anything else)."""
    if not isinstance(outcome, Normalized):
        return 0
    return sum(len(p) if isinstance(p, bytes) else int(p.nbytes) for p in outcome.payloads)


def _as_is(batch: Any) -> Any:
    return batch


def iterate_source(source: Iterable[Any], fast: bool = True, key: KeyFunction | None = None) -> Iterator[Item]:
    """Yield ``(index, outcome, key)`` for an iterable in its own order.

    An exception from the iterator is reported for that index; iteration then
    continues if the iterator allows it. A generator that raised is finished, so
    its failure is fatal even with ``on_error="skip"``.
    """
    it = iter(source)
    index = 0
    prepare = Preparer(fast, key)
    while True:
        try:
            sample = next(it)
        except StopIteration:
            return
        except Exception as exc:
            # a generator that raised is finished: skipping would silently lose the rest
            yield index, failure(exc, fatal=inspect.isgenerator(it)), None
            index += 1
            continue
        yield prepare(index, sample)
        index += 1
