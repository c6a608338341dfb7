"""Ctrl-C (and a supervisor's SIGTERM) ends a command at once, every time, and is remembered.

Python 3.11's `asyncio.run` turns SIGINT into ONE cancellation of its main task, and that
cancellation can be lost: a `wait_for` whose inner future completes at the same moment
returns the result and drops the cancel (nats-py's `next_msg` is such a `wait_for`). A
command following the log then ran on after the single SIGINT a supervisor sends; SIGTERM's
default ended it without closing its projection or connection, or stopping what it started.

Two ways to run under that rule, both remembering every stop signal in each enclosing block:
- `run_until_stopped(coro)` for an asyncio loop: the signal is handled by the loop (never
  raised inside asyncio's own code, which can drop a scheduled step), which cancels the main
  task, cancels it again every RECANCEL_S while it runs on, and gives up on it after
  `wind_down_s`; then `Interrupted` is raised. Its wind-down is bounded the same way.
- `stop_signals_raise()` for plain code (a redraw loop, a wait): the signal raises
  `Interrupted` at once; if the block then ends any other way (something swallowed it), it
  is raised again as the block ends.
`Interrupted` is a KeyboardInterrupt; `xirang` exits with 128 + the signal's number (130 for
Ctrl-C, 143 for SIGTERM). The scheduler and the host agent keep their own orderly stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
WIND_DOWN_S = 3.0  # how long tasks get to end (close a connection) once a stop signal came
RECANCEL_S = 1.0  # a task still running this long after its cancellation may have lost it


class Interrupted(KeyboardInterrupt):
    """A stop signal arrived; `exit_code` is what the process should exit with."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a process the signal ended."""
        return 128 + self.signum


class Received:
    """The stop signals received while a block ran (the first one decides the exit)."""

    def __init__(self) -> None:
        self.signals: list[int] = []

    def __bool__(self) -> bool:
        return bool(self.signals)

    def interrupted(self) -> Interrupted:
        """The exception for the first signal received."""
        return Interrupted(self.signals[0])


_open_blocks: list[Received] = []  # every block running now, outermost first


def _remember(signum: int) -> None:
    for block in _open_blocks:
        block.signals.append(signum)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def _remembering() -> Iterator[Received]:
    received = Received()
    _open_blocks.append(received)
    try:
        yield received
    finally:
        _open_blocks.remove(received)


@contextlib.contextmanager
def _signals_blocked(signals: tuple[int, ...]) -> Iterator[None]:
    """Signals held back (delivered afterwards) while handlers are swapped, so that none
    meets the default action in between."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def stop_signals_raise(signals: tuple[int, ...] = STOP_SIGNALS) -> Iterator[Received]:
    """While the block runs, each of `signals` raises Interrupted at once and is remembered;
    if the block then ends any other way, Interrupted is raised as it ends. The previous
    handlers come back afterwards. Outside the main thread (where Python cannot set handlers)
    nothing is installed. For code running an asyncio loop use run_until_stopped."""
    with _remembering() as received:
        if not _main_thread():
            yield received
            return

        def on_signal(signum, _frame):
            _remember(signum)
            raise Interrupted(signum)

        with _signals_blocked(signals):
            previous = {sig: signal.signal(sig, on_signal) or signal.SIG_DFL for sig in signals}
        try:
            yield received
        except KeyboardInterrupt:
            raise
        except BaseException as err:
            if received:  # e.g. a connection closing half-way reports an error: a stop was asked
                raise received.interrupted() from err
            raise
        finally:
            with _signals_blocked(signals):
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
        if received:
            raise received.interrupted()


def run_until_stopped(coro, wind_down_s: float = WIND_DOWN_S):
    """`asyncio.run(coro)`, except that Ctrl-C or SIGTERM ends it within about `wind_down_s`
    even when a cancellation is lost, and then raises Interrupted (see the module docstring).
    Its wind-down (tasks cancelled, async generators closed, the default executor shut down)
    is bounded too: asyncio.run waits for every cancelled task, and one that lost its
    cancellation never ends. What still runs after `wind_down_s` is left behind; the process
    is on its way out."""
    loop = asyncio.new_event_loop()
    with _remembering() as received:
        stopper = _Stopper(loop, wind_down_s)
        previous = stopper.install() if _main_thread() else {}
        try:
            asyncio.set_event_loop(loop)
            stopper.main = loop.create_task(coro)
            try:
                result = loop.run_until_complete(stopper.main)
            finally:
                stopper.wind_down()
        except BaseException as err:
            if not received or isinstance(err, Interrupted):
                raise
            if isinstance(err, asyncio.CancelledError):  # the cancellation the signal asked for
                raise received.interrupted() from None
            raise received.interrupted() from err  # e.g. a connection closed half-way
        finally:
            asyncio.set_event_loop(None)
            with _signals_blocked(tuple(previous)):
                loop.close()  # removes the loop's handlers (it sets the defaults back)
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
        if received:
            raise received.interrupted()
        return result


class _Stopper:
    """The loop's side of a stop signal: cancel the main task, again while it runs on, and
    stop the loop once the wind-down time is up or a second signal comes."""

    def __init__(self, loop: asyncio.AbstractEventLoop, wind_down_s: float) -> None:
        self.loop = loop
        self.wind_down_s = wind_down_s
        self.main: asyncio.Task | None = None
        self.deadline: float | None = None  # loop time; set by the first stop signal

    def install(self) -> dict:
        """The loop handles the stop signals from now on; the handlers it replaced."""
        with _signals_blocked(STOP_SIGNALS):
            previous = {sig: signal.getsignal(sig) or signal.SIG_DFL for sig in STOP_SIGNALS}
            for sig in STOP_SIGNALS:
                self.loop.add_signal_handler(sig, self.on_signal, sig)
        return previous

    def on_signal(self, signum: int) -> None:
        _remember(signum)
        if self.deadline is None:
            self.deadline = self.loop.time() + self.wind_down_s
            self._cancel_main()
        else:  # a second signal: no more waiting
            self.deadline = self.loop.time()
            self.loop.stop()

    def _cancel_main(self) -> None:
        if self.main is None or self.main.done():
            return
        left_s = self.deadline - self.loop.time()
        if left_s <= 0:
            self.loop.stop()
            return
        self.main.cancel()
        self.loop.call_later(min(RECANCEL_S, left_s), self._cancel_main)

    def wind_down(self) -> None:
        """Cancel what still runs (again while it runs on, up to the deadline), then close the
        async generators and the default executor once nothing runs."""
        loop = self.loop
        if self.deadline is None:
            self.deadline = loop.time() + self.wind_down_s
        tasks: list[asyncio.Task] = []
        with contextlib.suppress(RuntimeError):  # a second signal stopped the loop: give up
            while True:
                tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
                left_s = self.deadline - loop.time()
                if not tasks or left_s <= 0:
                    break
                for task in tasks:
                    task.cancel()
                done, _ = loop.run_until_complete(asyncio.wait(tasks, timeout=min(RECANCEL_S, left_s)))
                for task in done:
                    if not task.cancelled():
                        task.exception()  # retrieved: an error while stopping is not news now
            if not tasks:  # a task left running may still use its generators and threads
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
