"""Children that must take Ctrl-C: start them with SIGINT at its default action.

A test run launched in the background by a non-interactive shell (`cmd &`, as some CI runners and nohup wrappers
do) inherits SIGINT *ignored*; Python then installs no KeyboardInterrupt handler in the child, and a test that
sends SIGINT waits for its timeout instead of checking vitedge's interrupt handling. Measured here: all four
SIGINT tests of tests/test_atomic_output.py hung for 240 s each under `(nohup bash .ci/run &)`.
"""
from __future__ import annotations

import signal


def sigint_default() -> None:
    """`preexec_fn` for subprocess: SIGINT back to its default action in the child."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
