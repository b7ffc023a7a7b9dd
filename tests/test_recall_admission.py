"""Admission to the engine: a bounded queue with a deadline, slots owned by searches."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.recall.admission import Admission, Busy


async def test_callers_past_the_slots_wait_in_order_and_get_a_freed_slot():
    gate = Admission(slots=1, queue_max=4, wait_s=5)
    await gate.acquire()
    order: list[int] = []

    async def caller(i: int) -> None:
        await gate.acquire()
        order.append(i)
        gate.release()

    waiting = [asyncio.create_task(caller(i)) for i in range(3)]
    await asyncio.sleep(0.05)
    assert order == []
    gate.release()
    await asyncio.gather(*waiting)
    assert order == [0, 1, 2]


async def test_a_full_queue_answers_busy_at_once():
    gate = Admission(slots=1, queue_max=1, wait_s=5)
    await gate.acquire()
    first_waiter = asyncio.create_task(gate.acquire())
    await asyncio.sleep(0.01)
    started = time.monotonic()
    with pytest.raises(Busy) as busy:
        await gate.acquire()
    assert busy.value.reason == "queue_full" and time.monotonic() - started < 1.0  # wait_s is 5: no waiting at all
    gate.release()
    await first_waiter  # the slot went to the waiter


async def test_no_slot_within_the_deadline_answers_busy_and_leaves_the_queue():
    gate = Admission(slots=1, queue_max=4, wait_s=0.2)
    await gate.acquire()
    started = time.monotonic()
    with pytest.raises(Busy) as busy:
        await gate.acquire()
    assert busy.value.reason == "queue_timeout" and 0.15 < time.monotonic() - started < 1.0
    gate.release()
    await asyncio.wait_for(gate.acquire(), 0.1)  # the timed-out waiter did not keep the freed slot


async def test_a_caller_that_goes_away_while_waiting_loses_no_slot():
    gate = Admission(slots=1, queue_max=4, wait_s=5)
    await gate.acquire()
    waiter = asyncio.create_task(gate.acquire())
    await asyncio.sleep(0.01)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    gate.release()
    await asyncio.wait_for(gate.acquire(), 0.1)
    with pytest.raises(Busy):
        await Admission(slots=0, queue_max=0, wait_s=1).acquire()


async def test_many_racing_callers_never_exceed_the_slots_and_all_slots_come_back():
    gate = Admission(slots=3, queue_max=100, wait_s=0.05)
    running = peak = 0
    outcomes = {"ran": 0, "busy": 0}

    async def caller(i: int) -> None:
        nonlocal running, peak
        try:
            await gate.acquire()
        except Busy:
            outcomes["busy"] += 1
            return
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.001 * (i % 7))
        running -= 1
        outcomes["ran"] += 1
        gate.release()

    await asyncio.gather(*[caller(i) for i in range(300)])
    assert peak <= 3 and outcomes["ran"] + outcomes["busy"] == 300 and outcomes["ran"] > 0
    for _ in range(3):  # every slot was given back
        await asyncio.wait_for(gate.acquire(), 0.1)
