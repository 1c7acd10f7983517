"""A call that must not block on a FIFO: for the tests of reads that open a named file (issue 45).

Opening a FIFO for reading by name blocks until a writer opens it, so code that opens by name
without ``O_NONBLOCK`` hangs on one that a user put in place of a file. :func:`returns_on_fifo`
runs the call in a thread; if it has not returned in time, the FIFO is opened for writing and
closed (the blocked reader sees its end and goes on) and the test fails, so a test whose code
blocks fails instead of hanging the run.
"""

from __future__ import annotations

import os
import threading

import pytest


def returns_on_fifo(call, fifo: str | os.PathLike, seconds: float = 10.0):
    """``call()``'s value (or its exception, raised again), when it returns within ``seconds``.

    Args:
        call (Callable[[], object]): the code under test.
        fifo (str | os.PathLike): the FIFO it might block on.
        seconds (float): how long to wait.

    Raises:
        pytest.fail.Exception: the call was still blocked after ``seconds``.
    """
    out: dict = {}

    def run():
        try:
            out["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - raised again in the test's thread
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        for _ in range(100):        # let it go: a writer opens the FIFO and closes it at once
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
            thread.join(0.1)
            if not thread.is_alive():
                break
        pytest.fail(f"blocked on the FIFO {fifo} for {seconds} s (opened by name without O_NONBLOCK)")
    if "error" in out:
        raise out["error"]
    return out.get("value")
