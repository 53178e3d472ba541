"""The user-facing exception types, shared by every layer: a one-line message naming the problem and the fix.

The CLI maps them to exit code 2 (bad usage / bad input); every stage raises them for input it rejects. This is
the bottom of the import order (errors <- models <- targets <- exporter <- cli): it imports nothing of vitedge.
"""


class VitedgeError(Exception):
    """A user-facing error: ``str(err)`` is one line that names the problem and how to fix it. `api_hint`: a fix
    only the Python API has (a keyword argument), shown to API callers and left out of the CLI's line."""

    exit_code = 2

    def __init__(self, message: str = "", api_hint: str | None = None):
        super().__init__(message)
        self.message, self.api_hint = message, api_hint

    def __str__(self) -> str:
        return f"{self.message} ({self.api_hint})" if self.api_hint else self.message

    def cli_text(self) -> str:
        """The line the command line prints: without fixes that only the Python API has."""
        return self.message


class CheckpointError(VitedgeError):
    """A checkpoint that cannot be loaded safely or does not fit the model."""
