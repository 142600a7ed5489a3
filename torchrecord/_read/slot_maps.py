"""How a process maps batch slots (``torchrecord._read.slots``): without a descriptor, once per segment, and
freed only by the process that received the batch.

A slot is a ``memfd`` file mapped in the worker that fills it and in the main
process that reads it. Python's ``mmap.mmap`` keeps a duplicate of the file's
descriptor for as long as the map lives, so every kept batch used to hold one
descriptor in the main process and two in the worker, and keeping a few hundred
batches ran into ``ulimit -n``. :func:`map_shared` maps the file with
``mmap(2)`` directly: once mapped, the descriptor can be closed, and the memory
stays until the last view of it goes.

The receiving side: :func:`receive` maps a worker's segment the first time a
batch of it arrives (its descriptor comes with that batch) and keeps the map;
:func:`watch` frees the segment when the batch's last view is gone, in this
process only (a fork child, which holds a copy of the views, frees nothing) and
only while the segment's header still holds that handover's generation.

:func:`descriptor_error` is the one message for a handover that found no
descriptor left: the limit, what is open, and the ways out.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import mmap
import os
import threading
import weakref
from typing import Any

import numpy as np

try:  # imported now: with no descriptor left, importing a module fails too
    import resource
except ImportError:  # not POSIX: no slots either
    resource = None  # type: ignore[assignment]

from torchrecord.errors import InternalError, TooManyOpenFilesError

__all__ = [
    "FREE",
    "Received",
    "descriptor_error",
    "map_shared",
    "mapped_keys",
    "mapped_segments",
    "out_of_descriptors",
    "pid",
    "receive",
    "watch",
]

#: a segment's state (the first int64 of its header) when no batch of it is out; else the generation
#: (1, 2, ...) of the handover whose batch is out
FREE = 0

_MAP_FAILED = ctypes.c_void_p(-1).value


@functools.cache
def _libc() -> tuple[Any, Any]:
    """libc's ``mmap`` and ``munmap`` (loaded on first use: slots exist where ``memfd_create`` does)."""
    libc = ctypes.CDLL(None, use_errno=True)
    mmap_, munmap = libc.mmap, libc.munmap
    mmap_.restype = ctypes.c_void_p
    mmap_.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    munmap.restype = ctypes.c_int
    munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return mmap_, munmap


def map_shared(fd: int, size: int) -> Any:
    """The first ``size`` bytes of the file ``fd``, mapped shared and writable, as a ctypes byte array.

    The mapping holds no descriptor (``fd`` may be closed at once) and is
    unmapped when the array is gone: every view made of it (``from_buffer``,
    ``np.frombuffer``, a tensor of one) keeps the array, so none outlives the
    memory. A fork child keeps its own copy of the mapping.
    """
    mmap_, munmap = _libc()
    address = mmap_(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    if address is None or address == _MAP_FAILED:
        code = ctypes.get_errno()
        raise OSError(code, f"mmap of a {size}-byte shared-memory slot failed: {os.strerror(code)}")
    block = (ctypes.c_uint8 * size).from_address(address)
    # not at exit: module teardown may still touch a tensor of it, and the process's exit unmaps it anyway
    weakref.finalize(block, munmap, address, size).atexit = False
    return block


def out_of_descriptors(exc: BaseException) -> bool:
    """Did ``exc`` come from a process (EMFILE) or the system (ENFILE) having no file descriptor left?"""
    return isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)


def descriptor_error(what: str, exc: BaseException | None = None) -> TooManyOpenFilesError:
    """The error for a handover that ran out of descriptors while ``what`` (a sentence's start)."""
    if resource is None:
        raise InternalError("batch slots need a POSIX system")
    soft, hard = (
        "unlimited" if n == resource.RLIM_INFINITY else str(n) for n in resource.getrlimit(resource.RLIMIT_NOFILE)
    )
    try:
        opened = f"{len(os.listdir('/proc/self/fd')) - 1} are open; "
    except OSError:
        opened = ""
    cause = f" ({exc})" if exc is not None and str(exc) else ""
    return TooManyOpenFilesError(
        errno.EMFILE,
        f"{what}: no file descriptor left{cause}. Process {os.getpid()} may open {soft} (RLIMIT_NOFILE; hard "
        f"limit {hard}), {opened}handing a batch slot over needs one for a moment (a kept batch holds none). "
        "Raise the limit (`ulimit -n`, or resource.setrlimit(resource.RLIMIT_NOFILE, ...)), keep fewer batches "
        "and files open, or set TORCHRECORD_HANDOVER=value: batches then cross through the worker's pipe and "
        "use no descriptor",
    )


# -- the receiving side -------------------------------------------------------------------------
#: this process's pid; an at-fork hook keeps it current in a child (compared without a syscall)
_pid = os.getpid()


def pid() -> int:
    """This process's pid (kept by an at-fork hook: no system call)."""
    return _pid


class Received:
    """A worker's segment mapped in this process: ``block`` (header and data) and ``state`` (a view of the
    header's first int64)."""

    def __init__(self, fd: int, size: int) -> None:
        self.block = map_shared(fd, size)
        self.state = np.frombuffer(self.block, dtype=np.int64, count=1)


_received: dict[tuple[int, int, int], Received] = {}
_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _pid, _lock
    _pid = os.getpid()
    _lock = threading.Lock()  # a thread of the parent may have held it at the fork
    _received.clear()  # the parent's workers never hand this process a batch


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def mapped_segments() -> int:
    """How many worker segments this process has mapped (for tests and diagnostics)."""
    return len(_received)


def mapped_keys() -> set[tuple[int, int, int]]:
    """The keys (worker pid, worker nonce, segment number) of the segments this process has mapped (for tests)."""
    return set(_received)


def receive(key: tuple[int, int, int], fd: Any, size: int, retired: list[Any]) -> Received:
    """Worker segment ``key`` (``size`` bytes) mapped in this process: mapped once, from the descriptor
    (a ``multiprocessing.reduction.DupFd``) its first batch brought. ``retired``: segments the worker closed."""
    with _lock:
        for old in retired:
            _received.pop(tuple(old), None)
        mapping = _received.get(key)
        if mapping is not None:
            return mapping
        if fd is None:
            raise InternalError(f"a batch arrived from segment {key} of a worker, which this process never mapped")
        try:
            handle = fd.detach()
        except EOFError:  # the worker could not send it: its end of the connection failed
            what = f"DataLoader worker process {key[0]} sent no descriptor for a new batch slot (it most likely has "
            raise descriptor_error(what + "none left; it has this process's limit unless it changed it)") from None
        except OSError as exc:
            if not out_of_descriptors(exc):
                raise
            raise descriptor_error(f"taking a batch slot from DataLoader worker process {key[0]}", exc) from None
        try:
            mapping = Received(handle, size)
        finally:
            os.close(handle)
        _forget_dead_workers(exclude=key[0])
        _received[key] = mapping
        return mapping


def watch(owner: Any, state: np.ndarray, generation: int) -> None:
    """Free the segment of ``state`` when ``owner`` (what every view of the batch keeps) is gone."""
    weakref.finalize(owner, _free, state, generation, _pid)


def _free(state: np.ndarray, generation: int, receiver: int) -> None:
    """A batch's last view is gone: free its segment, when this is the process that received it (not a fork
    child holding a copy) and the segment still holds that handover (a stale free changes nothing)."""
    if receiver == _pid and state[0] == generation:
        state[0] = FREE


def _forget_dead_workers(exclude: int) -> None:
    """Drop the mappings of workers that have exited (batches still held keep their own reference)."""
    for key in [k for k in _received if k[0] != exclude]:
        try:
            os.kill(key[0], 0)
        except ProcessLookupError:
            del _received[key]
        except PermissionError:
            pass
