"""The user-facing exception types, shared by every layer: a one-line message naming the problem and the fix.

The CLI maps them to exit code 2 (bad usage / bad input); every stage raises them for input it rejects. This is
the bottom of the import order (errors <- models <- targets <- exporter <- cli): it imports nothing of vitedge.
"""


class VitedgeError(Exception):
    """A user-facing error: ``str(err)`` is one line that names the problem and how to fix it."""

    exit_code = 2


class CheckpointError(VitedgeError):
    """A checkpoint that cannot be loaded safely or does not fit the model."""
