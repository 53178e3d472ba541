"""The one exception type meant for users: a one-line message naming the problem and the fix.

The CLI maps it to exit code 2 (bad usage / bad input); every stage raises it for input it rejects.
"""


class VitedgeError(Exception):
    """A user-facing error: ``str(err)`` is one line that names the problem and how to fix it."""

    exit_code = 2


class CheckpointError(VitedgeError):
    """A checkpoint that cannot be loaded safely or does not fit the model."""
