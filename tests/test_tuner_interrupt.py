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

from ggml_dispatch.tuner.run import SweepInterrupted, _signals_raise


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


def test_a_failed_case_names_the_assertion_not_a_backtrace_frame() -> None:
    # ggml's abort handler prints the assertion, then backtrace_symbols_fd frames; the trial's status
    # must carry the assertion (a frame's address says nothing across builds)
    from ggml_dispatch.tuner.run import _failure_message

    stderr = "\n".join(
        [
            "harness: case MUL_MAT:weight:q4_K:f32:N4096:K4096:B1:M128: "
            "check route=cublas/out=f32,compute=f16",
            "/src/ggml/src/ggml-cuda/ggml-cuda.cu:1620: GGML_ASSERT(ne00 % 2 == 0) failed",
            "/lib/libggml-base.so.0(ggml_abort+0x15b)[0x7f5d2c1a2b3b]",
            "/bin/ggml-dispatch-harness(+0x14f15)[0x55ca45686f15]",
            "#3  0x00007f5d2c1a2b3b in ggml_abort ()",
        ]
    )
    msg = _failure_message(-6, stderr, False, 900.0)
    assert msg.startswith("killed by SIGABRT during check route=cublas/out=f32,compute=f16: ")
    assert msg.endswith("GGML_ASSERT(ne00 % 2 == 0) failed")
