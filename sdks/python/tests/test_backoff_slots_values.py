"""Local arithmetic: back-off with jitter, slot accounting, JSON ⇄ google.protobuf.Value."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
from google.protobuf import struct_pb2

from composer import Backoff
from composer._values import from_value, to_value
from composer.client import workflow_source_text
from composer.worker import Slots


def test_backoff_grows_exponentially_up_to_its_maximum() -> None:
    backoff = Backoff(initial=0.1, multiplier=2.0, maximum=1.0, jitter=0.0)
    assert [backoff.delay(n) for n in range(1, 7)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert backoff.delay(10**9) == 1.0  # no overflow, no long loop
    with pytest.raises(ValueError):
        backoff.delay(0)


def test_backoff_jitter_stays_within_its_band() -> None:
    backoff = Backoff(initial=1.0, multiplier=2.0, maximum=8.0, jitter=0.5)
    assert backoff.delay(3, rand=lambda: 0.0) == 4.0
    assert backoff.delay(3, rand=lambda: 0.999999) == pytest.approx(2.0, abs=1e-5)
    samples = [backoff.delay(3) for _ in range(2000)]
    assert all(2.0 <= s <= 4.0 for s in samples)
    assert max(samples) - min(samples) > 1.5  # actually spread out
    full = Backoff(initial=1.0, maximum=1.0, jitter=1.0)
    assert full.delay(1, rand=lambda: 0.5) == 0.5
    for bad in [dict(initial=0.0), dict(initial=2.0, maximum=1.0), dict(multiplier=0.5), dict(jitter=1.5)]:
        with pytest.raises(ValueError):
            Backoff(**bad)


def test_slots_count_and_wake_waiters() -> None:
    async def main() -> None:
        slots = Slots(2)
        assert (slots.free, slots.used) == (2, 0)
        slots.acquire(2)
        assert slots.free == 0 and slots.high_water == 2
        with pytest.raises(RuntimeError):
            slots.acquire()
        waiter = asyncio.create_task(slots.wait_free())
        idle = asyncio.create_task(slots.wait_idle())
        await asyncio.sleep(0.01)
        assert not waiter.done()
        slots.release()
        assert await asyncio.wait_for(waiter, 1) == 1
        assert not idle.done()
        slots.release()
        await asyncio.wait_for(idle, 1)
        with pytest.raises(RuntimeError):
            slots.release()
        with pytest.raises(ValueError):
            Slots(0)

    asyncio.run(main())


def test_values_round_trip_as_json_does() -> None:
    document = {"s": "x", "i": 3, "f": 2.5, "b": True, "n": None, "l": [1, "two", [3]], "d": {"k": {"z": -1}}}
    value = to_value(document)
    assert value.struct_value.fields["i"].number_value == 3.0
    assert from_value(value) == document
    assert isinstance(from_value(value)["i"], int)
    assert from_value(to_value((1, 2))) == [1, 2]
    assert from_value(struct_pb2.Value()) is None
    assert from_value(to_value(2**60)) == float(2**60)  # beyond 2**53: a float, as JSON numbers are


def test_values_refuse_what_is_not_json() -> None:
    with pytest.raises(TypeError, match=r"\$\.a\[1\]: set"):
        to_value({"a": [1, {1, 2}]})
    with pytest.raises(TypeError, match="key"):
        to_value({1: "x"})
    with pytest.raises(ValueError):
        to_value(math.nan)


def test_workflow_sources(tmp_path: Path) -> None:
    path = tmp_path / "wf.yaml"
    path.write_text("name: from_file\n", encoding="utf-8")
    assert workflow_source_text(path) == "name: from_file\n"
    assert workflow_source_text("name: inline\n") == "name: inline\n"
    assert workflow_source_text({"name": "d", "nodes": []}) == '{"name": "d", "nodes": []}'
    with pytest.raises(TypeError):
        workflow_source_text(42)  # type: ignore[arg-type]
