"""`vitedge package`: app-ready bundles that check themselves: what every bundle shares (bundle), CoreML
(package) and ExecuTorch for Android (package_android).
"""
from __future__ import annotations

from ...targets.rows import COREML_ROW, EXECUTORCH_ROW

# `vitedge package --target`: target -> its bundle maker ("module:function" in this package, imported when used;
# None: the CoreML bundle of package.py). Torch-free, so the command line's choices come from here.
BUNDLES = {COREML_ROW.name: None, EXECUTORCH_ROW.name: ".package_android:package_executorch"}
