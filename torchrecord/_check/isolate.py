"""Run functions in a forked child process, so that liblmdb dying on a damaged file
(SIGSEGV, SIGBUS, an assertion's SIGABRT) or looping on it cannot take the caller down.

:func:`run_in_child` reports exactly what happened (a value, an exception, a signal,
a timeout); :func:`run_each_in_child` does the same for several calls, all in one
child while it lives (one fork instead of many); :func:`run_isolated` turns a death by
signal or a timeout into :class:`~torchrecord.errors.StructureError`, for ``verify``.

The child is a plain ``fork()``: it starts at once and shares the caller's imports,
but it must not use LMDB environments (or other resources) inherited from the parent;
the function opens what it needs. Results travel back as msgpack (no pickle), so the
function must return msgpack-able values (None, bool, int, float, str, bytes, lists,
dicts). A fork while other threads hold locks can deadlock the child; the timeout then
reports it, so keep the function's work to LMDB and plain Python.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import select
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any, NoReturn

import msgpack

from torchrecord import errors
from torchrecord.errors import ArgumentError, StructureError, TorchRecordError

__all__ = ["ChildOutcome", "run_each_in_child", "run_each_isolated", "run_in_child", "run_isolated"]

#: bytes of the child's standard error kept for the report (liblmdb's assertion text)
_STDERR_TAIL = 2000
#: largest result the parent accepts from one call
_MAX_RESULT = 64 << 20
#: exit status of a child whose reporting failed
_REPORT_FAILED = 70


@dataclass(frozen=True)
class ChildOutcome:
    """How one call in a child process ended.

    ``status`` is ``"returned"`` (``value`` holds the result), ``"raised"``
    (``error_type``, ``message``), ``"signal"`` (the child was killed by
    ``signal_number`` during this call), ``"timeout"`` (killed after ``timeout``
    seconds), or ``"exited"`` (the child ended during this call without a result;
    ``exit_code``). ``stderr`` is the tail of what the child had written to its
    standard error when it died (empty for calls that returned or raised).
    """

    status: str
    value: Any = None
    error_type: str = ""
    message: str = ""
    signal_number: int = 0
    exit_code: int = 0
    stderr: str = ""
    seconds: float = 0.0

    @property
    def signal_name(self) -> str:
        try:
            return signal.Signals(self.signal_number).name
        except ValueError:
            return f"signal {self.signal_number}"


def run_in_child(fn: Callable[..., Any], *args: Any, timeout: float, memory_limit: int | None = None) -> ChildOutcome:
    """Run ``fn(*args)`` in a forked child and report how it ended; never raises for the child's fate.

    Args:
        fn: the function; its return value must be msgpack-able.
        timeout: seconds of wall-clock time before the child is killed (``"timeout"``).
        memory_limit: bytes of address space the child may add to what it inherits
            (``RLIMIT_AS``); an allocation beyond it fails with ``MemoryError`` there.
    """
    return run_each_in_child(lambda _: fn(*args), [None], timeout=timeout, memory_limit=memory_limit)[0]


def run_each_in_child(
    fn: Callable[[Any], Any], items: Sequence[Any], *, timeout: float, memory_limit: int | None = None
) -> list[ChildOutcome]:
    """``fn(item)`` for each item, in order, in forked children: one outcome per item.

    The calls share one child while it lives; after a death (signal, timeout, exit) the
    remaining items go on in a fresh child. Each call has ``timeout`` seconds; the
    memory limit is the child's, shared by the calls it runs (see :func:`run_in_child`).
    """
    if timeout <= 0:
        raise ArgumentError(f"timeout must be > 0 seconds, got {timeout}")
    if memory_limit is not None and memory_limit <= 0:
        raise ArgumentError(f"memory_limit must be > 0 bytes or None, got {memory_limit}")
    outcomes: list[ChildOutcome] = []
    while len(outcomes) < len(items):
        outcomes += _one_child(fn, items[len(outcomes) :], timeout, memory_limit)
    return outcomes


def run_isolated(
    fn: Callable[..., Any],
    *args: Any,
    timeout: float,
    memory_limit: int | None = None,
    name: str = "the file",
) -> Any:
    """``fn(*args)`` in a forked child; its death by a signal or a timeout is structural damage.

    Returns what ``fn`` returned. A torchrecord error raised in the child is raised again
    here (same class, same message). Raises :class:`StructureError` naming ``name`` when
    the child was killed by a signal (liblmdb read outside its map or failed an assertion),
    ran past ``timeout`` (liblmdb looping on a damaged file, or a file too large for the
    timeout: raise it then) or ran out of ``memory_limit``, and :class:`TorchRecordError`
    for anything else the child did.
    """
    outcome = run_in_child(fn, *args, timeout=timeout, memory_limit=memory_limit)
    if outcome.status == "returned":
        return outcome.value
    _raise_for(outcome, name, timeout, memory_limit)


def run_each_isolated(
    fn: Callable[[Any], Any],
    items: Sequence[Any],
    *,
    timeout: float,
    each: Callable[[Any], None],
    memory_limit: int | None = None,
    name: str = "the file",
) -> None:
    """``fn(item)`` for each item, in order, all in one forked child; ``each(value)`` gets each result
    as it arrives (e.g. to move a progress bar).

    The first call that does not return ends it all: the child is killed and the
    outcome raised as :func:`run_isolated` raises it (:class:`StructureError` for a
    signal, a timeout of one call, or an exhausted memory limit). An exception from
    ``each`` also kills the child and propagates.
    """
    if timeout <= 0:
        raise ArgumentError(f"timeout must be > 0 seconds, got {timeout}")

    def handle(outcome: ChildOutcome) -> None:
        if outcome.status != "returned":
            _raise_for(outcome, name, timeout, memory_limit)
        each(outcome.value)

    if items:
        _one_child(fn, items, timeout, memory_limit, handle)


def _raise_for(outcome: ChildOutcome, name: str, timeout: float, memory_limit: int | None) -> NoReturn:
    """Raise what an outcome other than ``"returned"`` means (see :func:`run_isolated`)."""
    last_line = outcome.stderr.strip().splitlines()[-1:] if outcome.stderr.strip() else []
    said = f" (it said: {last_line[0][:300]})" if last_line else ""
    if outcome.status == "signal":
        raise StructureError(
            f"{name}: a process reading it with liblmdb was killed by {outcome.signal_name}{said}; "
            f"LMDB's page structure is damaged; {StructureError.HINT}"
        )
    if outcome.status == "timeout":
        raise StructureError(
            f"{name}: a process reading it with liblmdb did not finish in {timeout:g} s; LMDB's page "
            "structure is probably damaged (a loop), or the file is too large for this timeout; "
            f"{StructureError.HINT}"
        )
    if outcome.status == "raised":
        cls = getattr(errors, outcome.error_type, None)
        if isinstance(cls, type) and issubclass(cls, TorchRecordError):
            raise cls(outcome.message)
        if outcome.error_type == "MemoryError":
            allowed = (
                f"more than the {memory_limit} bytes allowed"
                if memory_limit is not None
                else "more memory than there is"
            )
            raise StructureError(
                f"{name}: reading it needed {allowed}; a damaged file can claim huge sizes; {StructureError.HINT}"
            )
        raise TorchRecordError(f"{name}: the checking process failed with {outcome.error_type}: {outcome.message}")
    raise TorchRecordError(
        f"{name}: the checking process exited with status {outcome.exit_code} without a result{said}"
    )


def _one_child(
    fn: Callable[[Any], Any],
    items: Sequence[Any],
    timeout: float,
    memory_limit: int | None,
    each: Callable[[ChildOutcome], None] | None = None,
) -> list[ChildOutcome]:
    """Fork one child for ``items``; the outcomes of those it got through (at least one).

    ``each`` sees every outcome as it comes; if it raises, the child is killed.
    """
    read_end, write_end = os.pipe()
    outcomes: list[ChildOutcome] = []
    with tempfile.TemporaryFile() as stderr_file:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+: fork with threads
            pid = os.fork()
        if pid == 0:  # the child: never returns
            os.close(read_end)
            _child(fn, items, write_end, stderr_file.fileno(), memory_limit)
        os.close(write_end)
        status: int | None = None
        unpacker = msgpack.Unpacker(raw=False, max_buffer_size=_MAX_RESULT)
        finished = False  # every result read: the child is exiting on its own
        try:
            while len(outcomes) < len(items):
                start = time.monotonic()
                message, ended = _next_message(read_end, unpacker, start + timeout)
                seconds = time.monotonic() - start
                if message is not None:
                    outcomes.append(_outcome(message, seconds))
                    if each is not None:
                        each(outcomes[-1])
                    continue
                if ended:  # the child died (or exited) during this call
                    status = _wait(pid, time.monotonic() + timeout)
                if status is None:
                    outcomes.append(ChildOutcome("timeout", stderr=_tail(stderr_file), seconds=seconds))
                elif os.WIFSIGNALED(status):
                    outcomes.append(
                        ChildOutcome(
                            "signal", signal_number=os.WTERMSIG(status), stderr=_tail(stderr_file), seconds=seconds
                        )
                    )
                else:
                    outcomes.append(
                        ChildOutcome(
                            "exited", exit_code=os.WEXITSTATUS(status), stderr=_tail(stderr_file), seconds=seconds
                        )
                    )
                if each is not None:
                    each(outcomes[-1])
                break
            else:
                finished = True
        finally:
            os.close(read_end)
            if status is None and finished:
                status = _wait(pid, time.monotonic() + timeout)
            if status is None:  # past a deadline, or interrupted: the child goes
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    return outcomes


def _outcome(message: Any, seconds: float) -> ChildOutcome:
    if isinstance(message, list) and len(message) == 2 and message[0] == "returned":
        return ChildOutcome("returned", value=message[1], seconds=seconds)
    if isinstance(message, list) and len(message) == 3 and message[0] == "raised":
        return ChildOutcome("raised", error_type=str(message[1]), message=str(message[2]), seconds=seconds)
    return ChildOutcome(
        "raised", error_type="TypeError", message=f"unreadable result {message!r:.200}", seconds=seconds
    )


def _child(
    fn: Callable[[Any], Any], items: Sequence[Any], result_fd: int, stderr_fd: int, memory_limit: int | None
) -> None:
    """The child's whole life: limit, run each call and report it, ``_exit`` (no atexit, no flushes)."""
    code = 0
    try:
        os.dup2(stderr_fd, 2)
        faulthandler.disable()  # its dump would go to the parent's terminal; the death is reported instead
        if memory_limit is not None:
            import resource

            _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            limit = _address_space() + memory_limit
            if hard != resource.RLIM_INFINITY:
                limit = min(limit, hard)
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        for item in items:
            try:
                message: list[Any] = ["returned", fn(item)]
            except BaseException as exc:  # everything goes back to the parent
                message = ["raised", type(exc).__name__, str(exc)]
                if not isinstance(exc, TorchRecordError | MemoryError):
                    with contextlib.suppress(BaseException):
                        traceback.print_exc()
            try:
                payload = msgpack.packb(message, use_bin_type=True)
            except (TypeError, ValueError, OverflowError) as exc:
                payload = msgpack.packb(["raised", "TypeError", f"the result is not msgpack-able: {exc}"])
            with contextlib.suppress(BaseException):
                sys.stderr.flush()
            view = memoryview(payload)
            while view:
                view = view[os.write(result_fd, view) :]
    except BaseException:
        code = _REPORT_FAILED
    finally:
        os._exit(code)


def _next_message(fd: int, unpacker: msgpack.Unpacker, deadline: float) -> tuple[Any, bool]:
    """(the child's next message, False), (None, True) when it closed the pipe, (None, False) at the deadline."""
    while True:
        try:
            return next(unpacker), False
        except StopIteration:
            pass
        except (ValueError, msgpack.UnpackException) as exc:  # a result too large, or garbled
            return ["raised", "ValueError", f"unreadable result: {exc}"], False
        left = deadline - time.monotonic()
        if left <= 0:
            return None, False
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return None, True
            try:
                unpacker.feed(chunk)
            except msgpack.BufferFull:
                return ["raised", "ValueError", f"a result larger than {_MAX_RESULT} bytes"], False


def _wait(pid: int, deadline: float) -> int | None:
    """Reap the child; None if it is still alive at the deadline."""
    pidfd = -1
    with contextlib.suppress(AttributeError, OSError):
        pidfd = os.pidfd_open(pid)  # Linux 5.3+: readable once the child has exited
    try:
        pause = 0.0002
        while True:
            waited, status = os.waitpid(pid, os.WNOHANG)
            if waited:
                return status
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if pidfd >= 0:
                select.select([pidfd], [], [], left)
            else:
                time.sleep(min(pause, left))
                pause = min(pause * 2, 0.05)
    finally:
        if pidfd >= 0:
            os.close(pidfd)


def _tail(stderr_file: IO[bytes]) -> str:
    stderr_file.seek(0, os.SEEK_END)
    stderr_file.seek(max(0, stderr_file.tell() - _STDERR_TAIL))
    return stderr_file.read().decode("utf-8", "replace")


def _address_space() -> int:
    """This process's current virtual size in bytes."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
