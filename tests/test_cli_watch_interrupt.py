"""`--watch` ends on Ctrl-C even when a draw swallows the interrupt. A draw runs an asyncio
loop, and Python 3.11's asyncio.run can lose the cancellation Ctrl-C turns into; the watch
then redrew forever (a CI run of `xirang queue --watch` did not exit within 10 s of SIGINT)."""

from __future__ import annotations

import argparse
import os
import signal
import time

import pytest

from xirang.cmd_jobs import _repeat

pytestmark = pytest.mark.timeout(30)


def test_watch_stops_after_a_draw_that_swallowed_ctrl_c():
    before = signal.getsignal(signal.SIGINT)
    draws: list[int] = []

    def draw() -> int:
        draws.append(1)
        assert len(draws) <= 2, "the watch drew again after Ctrl-C"
        if len(draws) == 2:
            try:
                os.kill(os.getpid(), signal.SIGINT)  # a real signal, to this process
                time.sleep(1)  # the handler runs here, as it would inside an event loop
            except KeyboardInterrupt:
                pass  # swallowed, as a lost asyncio cancellation is
        return 0

    with pytest.raises(KeyboardInterrupt):
        _repeat(argparse.Namespace(watch=0.01, json=True), draw)
    assert len(draws) == 2
    assert signal.getsignal(signal.SIGINT) is before


def test_watch_ends_at_once_on_ctrl_c_between_draws():
    draws: list[int] = []

    def draw() -> int:
        draws.append(1)
        if len(draws) == 1:
            signal.setitimer(signal.ITIMER_REAL, 0.05)  # SIGALRM -> SIGINT while it sleeps
        return 0

    previous_alarm = signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGINT))
    try:
        began = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            _repeat(argparse.Namespace(watch=30, json=True), draw)
    finally:
        signal.signal(signal.SIGALRM, previous_alarm)
    assert draws == [1]
    assert time.monotonic() - began < 10  # not after the 30 s sleep
