"""Progress lines for steps that take longer than a second (stderr, so stdout stays the summary)."""
from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager


class Progress:
    """`with progress.step("exporting ONNX"): ...` prints the step once it has run `delay` seconds, then its time."""

    def __init__(self, stream=None, delay: float = 1.0, enabled: bool = True):
        self.stream = stream if stream is not None else sys.stderr
        self.delay = delay
        self.enabled = enabled

    def _say(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def note(self, text: str) -> None:
        """A one-off line (e.g. what was cleaned up before starting)."""
        if self.enabled:
            self._say(f"  note: {text}")

    @contextmanager
    def step(self, label: str):
        if not self.enabled:
            yield
            return
        shown = threading.Event()

        def announce():
            shown.set()
            self._say(f"  ... {label}")

        timer = threading.Timer(self.delay, announce)
        timer.daemon = True
        t0 = time.perf_counter()
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            if shown.is_set():
                self._say(f"      {label}: {time.perf_counter() - t0:.1f} s")


QUIET = Progress(enabled=False)
