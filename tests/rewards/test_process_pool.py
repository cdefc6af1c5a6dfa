"""The killable process pool: ordered results, timed-out and crashed workers replaced, usable from threads."""

from __future__ import annotations

import functools
import operator
import os
import threading
import time
from collections.abc import Iterator

import pytest

from or1.rewards.process_pool import ERROR, OK, TIMEOUT, ProcessPool


@pytest.fixture(scope="module")
def pool() -> Iterator[ProcessPool]:
    with ProcessPool(2, memory_mb=None) as p:
        yield p


def test_results_come_back_in_order(pool: ProcessPool) -> None:
    outcomes = pool.map(operator.mul, [(i, 3) for i in range(20)], timeout=5.0)
    assert [o.value for o in outcomes] == [i * 3 for i in range(20)]
    assert {o.status for o in outcomes} == {OK}


def test_a_hung_task_times_out_and_its_worker_is_replaced(pool: ProcessPool) -> None:
    started = time.monotonic()
    outcomes = pool.map(time.sleep, [(60,), (0,), (60,)], timeout=1.0)
    assert time.monotonic() - started < 10
    assert [o.status for o in outcomes] == [TIMEOUT, OK, TIMEOUT]
    assert [o.value for o in pool.map(operator.add, [(1, 1)] * 4, timeout=5.0)] == [2] * 4


def test_errors_and_dead_workers_are_reported_not_raised(pool: ProcessPool) -> None:
    outcomes = pool.map(operator.truediv, [(1, 0), (4, 2)], timeout=5.0)
    assert outcomes[0].status == ERROR and "ZeroDivisionError" in outcomes[0].error
    assert outcomes[1].value == 2
    died = pool.map(os._exit, [(3,)], timeout=5.0)[0]
    assert died.status == ERROR and "died" in died.error
    assert pool.map(operator.neg, [(5,)], timeout=5.0)[0].value == -5


def test_usable_from_other_threads(pool: ProcessPool) -> None:
    answers: dict[int, list[int]] = {}

    def work(k: int) -> None:
        answers[k] = [o.value for o in pool.map(operator.add, [(k, i) for i in range(5)], timeout=5.0)]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert answers == {k: [k + i for i in range(5)] for k in range(3)}


def test_fork_context_is_refused_and_closed_pool_is_unusable() -> None:
    with pytest.raises(ValueError):
        ProcessPool(1, context="fork")
    pool = ProcessPool(1, context="spawn", memory_mb=None)
    assert pool.map(abs, [(-2,)], timeout=30.0)[0].value == 2
    pool.close()
    with pytest.raises(RuntimeError):
        pool.map(abs, [(-2,)], timeout=1.0)


def test_memory_bomb_is_an_error_not_a_dead_machine() -> None:
    with ProcessPool(1, memory_mb=1024) as pool:
        outcome = pool.map(bytearray, [(8 * 2**30,)], timeout=10.0)[0]
    assert outcome.status == ERROR and "MemoryError" in outcome.error


def test_start_warms_the_workers_up_before_the_first_task() -> None:
    with ProcessPool(1, memory_mb=None, warmup=functools.partial(time.sleep, 1.5)) as pool:
        pool.start()  # returns at once; the worker imports and warms up in the background
        time.sleep(2.5)
        begun = time.monotonic()
        assert pool.map(operator.neg, [(4,)], timeout=5.0)[0].value == -4
        assert time.monotonic() - begun < 1.0  # a cold worker would first sleep 1.5 s


def test_start_can_wait_until_every_worker_is_warm() -> None:
    with ProcessPool(2, memory_mb=None, warmup=functools.partial(time.sleep, 1.0)) as pool:
        begun = time.monotonic()
        pool.start(wait=True)
        assert time.monotonic() - begun >= 1.0
        begun = time.monotonic()
        assert [o.value for o in pool.map(operator.neg, [(1,), (2,)], timeout=5.0)] == [-1, -2]
        assert time.monotonic() - begun < 0.5  # both workers were ready: neither task waited for a warm-up
