"""coremltools' first import in a vitedge process: without its Linux noise, and in vitedge's own process (the CLI)
without the packages it imports only for converters vitedge never calls."""
from __future__ import annotations

import contextlib
import io
import logging
import sys
import warnings

# Packages `import coremltools` imports whenever they are installed, for converters vitedge never calls: scikit-learn
# models, ExecuTorch edge programs, torchao-quantized torch ops, torchaudio ops, and transformers (for a flag
# nothing reads). benchmarks/export_time.py times the import with and without them. Skipped only in vitedge's own
# process (the CLI: lean_coremltools_import), where no user code can want those converters later.
UNUSED_CONVERTER_DEPS = ("sklearn", "executorch", "torchao", "torchaudio", "transformers")
_LEAN = [False]


def lean_coremltools_import() -> None:
    """In this process, coremltools' first import skips UNUSED_CONVERTER_DEPS (each stays importable afterwards;
    only coremltools' own converters for them are off)."""
    _LEAN[0] = True


def _import_coremltools() -> None:
    skipped = [m for m in UNUSED_CONVERTER_DEPS if m not in sys.modules] \
        if _LEAN[0] and "coremltools" not in sys.modules else []
    for m in skipped:
        sys.modules[m] = None  # `import m` raises ImportError: coremltools records the converter as unavailable
    try:
        import coremltools  # noqa: F401
    finally:
        for m in skipped:
            if sys.modules.get(m, 0) is None:
                del sys.modules[m]


@contextlib.contextmanager
def quiet_coremltools():
    """Import/use coremltools without its Linux noise ("Failed to load _MLModelProxy", untested-torch warnings, and
    where torchao is installed (the executorch extra), the torchao import coremltools makes: its CUDA kernels that
    cannot load, torch's pytree deprecation note)."""
    loggers = [logging.getLogger(n) for n in ("coremltools", "torchao", "torch.utils._pytree")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with contextlib.redirect_stderr(io.StringIO()):
                _import_coremltools()  # (the first import prints the noise)
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
