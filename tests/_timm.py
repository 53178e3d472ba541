"""timm as a test-only reference implementation.

timm imports torchvision, and the torchvision wheel that pip pairs with timm registers C++ operators
(`torchvision::nms`, ...) that our CPU torch build does not have, so `import torchvision` fails while
registering their fake/autograd kernels. Those two registration modules are the only parts that touch the
missing operators and timm never calls them, so empty stand-ins let the import proceed.
"""
from __future__ import annotations

import sys
import types

import pytest

_STUBBED = ("torchvision._meta_registrations", "torchvision._autograd_registrations")


def import_timm():
    """Return the `timm` module, or skip the calling test with the reason it cannot be imported."""
    for name in _STUBBED:
        sys.modules.setdefault(name, types.ModuleType(name))
    try:
        import timm
    except ImportError as e:
        pytest.skip(f"timm is not importable ({e}); install it for reference tests: "
                    "pip install timm==1.0.31 torchvision==0.28.0 --no-deps")
    except RuntimeError as e:  # a torchvision/torch operator mismatch beyond the stubbed modules
        pytest.skip(f"timm import failed against this torch build ({e})")
    return timm
