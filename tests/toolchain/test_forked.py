"""A function run in a forked child with a timeout (toolchain/tune/forked.py): its result, however large; a
child that does not return in time is killed; one that dies or raises says so; the parent's state is untouched."""

import os
import time

import pytest

from toolchain.tune import forked


def test_the_childs_result_comes_back_whole_and_the_parent_is_untouched():
    seen = []

    def work():
        seen.append("child")  # in the child's copy of this list only
        return {"pid": os.getpid(), "big": "x" * 300_000}  # more than a pipe holds at once

    ok, value = forked.call(work, 30)
    assert ok and value["pid"] != os.getpid() and len(value["big"]) == 300_000
    assert seen == []


def test_a_child_past_its_timeout_is_killed_and_a_dead_one_says_so():
    started = time.monotonic()
    assert forked.call(lambda: time.sleep(60), 0.5) == (False, "timed out after 0 s")
    assert time.monotonic() - started < 30  # killed, not waited for (a generous bound)
    ok, why = forked.call(lambda: os.abort(), 30)
    assert not ok and why.startswith("crashed")
    assert forked.call(lambda: 1 / 0, 30) == (False, "failed: ZeroDivisionError: division by zero")


def test_an_interrupted_caller_takes_its_child_with_it():
    import signal

    import psutil

    def interrupt(*_):
        raise KeyboardInterrupt

    before = {c.pid for c in psutil.Process().children()}
    old = signal.signal(signal.SIGALRM, interrupt)
    signal.alarm(1)
    try:
        with pytest.raises(KeyboardInterrupt):
            forked.call(lambda: time.sleep(60), 30)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert {c.pid for c in psutil.Process().children()} <= before
