"""A signal during a sweep always ends it, even when the handler's raise is swallowed.

Python ignores exceptions raised where it cannot propagate them (at-fork hooks such as logging's
lock release, finalizers): a SIGTERM landing while a case's harness is forked used to be lost
and the sweep ran to completion with exit 0. A finalizer stands in for the at-fork hook here.
"""

from __future__ import annotations

import gc
import os
import signal

import pytest

from tuner.run import SweepInterrupted, _signals_raise


class _SignalsInFinalizer:
    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here; its raise is ignored


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_swallowed_interrupt_is_raised_by_the_check() -> None:
    with _signals_raise() as interrupted:
        obj = _SignalsInFinalizer()
        del obj
        gc.collect()
        with pytest.raises(SweepInterrupted) as e:
            interrupted()
    assert e.value.signum == signal.SIGTERM


def test_no_signal_no_interrupt_and_handlers_are_restored() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with _signals_raise() as interrupted:
        interrupted()
    assert signal.getsignal(signal.SIGTERM) is before
