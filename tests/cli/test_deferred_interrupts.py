"""``deferred_interrupts``: Ctrl-C held while a write finishes, an ignored SIGINT kept ignored."""

from __future__ import annotations

import os
import signal

from dsh.cli._common import deferred_interrupts


def test_a_sigint_inside_the_block_is_recorded_not_raised() -> None:
    previous = signal.getsignal(signal.SIGINT)
    with deferred_interrupts() as caught:
        os.kill(os.getpid(), signal.SIGINT)
    assert caught == [signal.SIGINT]
    assert signal.getsignal(signal.SIGINT) is previous


def test_an_ignored_sigint_stays_ignored() -> None:
    # nohup and `dsh import ... &` in a script start dsh with SIGINT ignored: a Ctrl-C meant
    # for the foreground job must not stop the background import.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with deferred_interrupts() as caught:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
        assert caught == []
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
