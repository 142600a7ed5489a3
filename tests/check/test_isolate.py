"""Running functions in a forked child (torchrecord/_isolate.py): values and torchrecord
errors come back as they were; a death by signal, a timeout or an exhausted memory limit
becomes a StructureError naming the file; the caller always survives."""

from __future__ import annotations

import ctypes
import os
import time

import pytest

from torchrecord._check.isolate import run_each_in_child, run_in_child, run_isolated
from torchrecord.errors import ChecksumError, StructureError, TorchRecordError


def _value(x: int) -> dict[str, object]:
    return {"x": x, "pid": os.getpid(), "raw": b"\x00\xff"}


def _checksum_error() -> None:
    raise ChecksumError("set.tr: record 3: CRC-32 mismatch")


def _segfault() -> None:
    ctypes.string_at(0)


def _assertion() -> None:
    os.write(2, b"mdb.c:5605: Assertion 'root > 1' failed in mdb_page_search()\n")
    os.abort()


def _sleep() -> None:
    time.sleep(60)


def _allocate() -> int:
    return len(bytearray(8 << 30))


def _bug() -> float:
    return 1 / 0


def _unsendable() -> object:
    return object()


def test_a_value_comes_back_from_another_process() -> None:
    value = run_isolated(_value, 7, timeout=30)
    assert value["x"] == 7 and value["raw"] == b"\x00\xff" and value["pid"] != os.getpid()


def test_a_torchrecord_error_is_raised_again_as_itself() -> None:
    with pytest.raises(ChecksumError, match="record 3: CRC-32 mismatch"):
        run_isolated(_checksum_error, timeout=30)


def test_a_crash_is_structural_damage_and_the_caller_survives() -> None:
    with pytest.raises(StructureError, match=r"set\.tr: a process reading it with liblmdb was killed by SIGSEGV"):
        run_isolated(_segfault, timeout=30, name="set.tr")
    with pytest.raises(StructureError, match=r"killed by SIGABRT \(it said: mdb\.c:5605: Assertion 'root > 1'"):
        run_isolated(_assertion, timeout=30, name="set.tr")


def test_a_hang_is_reported_after_the_timeout() -> None:
    start = time.monotonic()
    with pytest.raises(StructureError, match=r"did not finish in 0\.5 s"):
        run_isolated(_sleep, timeout=0.5, name="set.tr")
    assert time.monotonic() - start < 10


def test_the_memory_limit_holds() -> None:
    outcome = run_in_child(_allocate, timeout=30, memory_limit=256 << 20)
    assert outcome.status == "raised" and outcome.error_type == "MemoryError"
    with pytest.raises(StructureError, match="needed more than the 268435456 bytes allowed"):
        run_isolated(_allocate, timeout=30, memory_limit=256 << 20, name="set.tr")


def test_other_failures_are_torchrecord_errors() -> None:
    with pytest.raises(TorchRecordError, match="ZeroDivisionError"):
        run_isolated(_bug, timeout=30)
    with pytest.raises(TorchRecordError, match="not msgpack-able"):
        run_isolated(_unsendable, timeout=30)


def test_several_calls_share_a_child_and_go_on_after_a_death() -> None:
    def step(item: str) -> int:
        if item == "crash":
            _segfault()
        if item == "hang":
            _sleep()
        return os.getpid()

    outcomes = run_each_in_child(step, ["a", "b", "crash", "c", "hang", "d"], timeout=1.0)
    assert [o.status for o in outcomes] == ["returned", "returned", "signal", "returned", "timeout", "returned"]
    assert outcomes[0].value == outcomes[1].value  # one child for both
    assert outcomes[3].value not in (outcomes[0].value, outcomes[5].value)  # a fresh child after each death
    assert outcomes[2].signal_name == "SIGSEGV"


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="timeout"):
        run_in_child(_value, 1, timeout=0)
    with pytest.raises(ValueError, match="memory_limit"):
        run_in_child(_value, 1, timeout=1, memory_limit=0)


def _out_of_memory() -> None:
    raise MemoryError()


def test_running_out_of_memory_without_a_limit_names_no_limit() -> None:
    """verify reported "needed more than the None bytes allowed" (issue 30, finding 8)."""
    with pytest.raises(StructureError, match=r"set.tr: reading it needed more memory than there is") as caught:
        run_isolated(_out_of_memory, timeout=30, name="set.tr")
    assert "None" not in str(caught.value)
