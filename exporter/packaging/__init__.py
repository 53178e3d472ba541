"""`vitedge package`: app-ready bundles that check themselves: what every bundle shares (bundle), CoreML
(package) and ExecuTorch for Android (package_android).
"""
from __future__ import annotations

from ...targets import rows


def bundles() -> dict[str, str]:
    """`vitedge package --target`: target -> its bundle maker ("module:function", its row's `bundle`, imported when
    used). Torch-free, so the command line's choices come from here."""
    return {r.name: r.bundle for r in rows() if r.bundle}
