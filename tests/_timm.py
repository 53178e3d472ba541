"""timm and Hugging Face transformers as test-only reference implementations.

Both import torchvision when it is installed (transformers for its image processors' torchvision backend), and the torchvision wheel that pip pairs with timm registers C++ operators
(`torchvision::nms`, ...) that our CPU torch build does not have, so `import torchvision` fails while
registering their fake/autograd kernels. Those two registration modules are the only parts that touch the
missing operators and neither library calls them, so empty stand-ins let the import proceed.
"""
from __future__ import annotations

import sys
import types

from vitedge.tests._ci import unavailable

_STUBBED = ("torchvision._meta_registrations", "torchvision._autograd_registrations")


def stub_torchvision() -> None:
    """Empty stand-ins for torchvision's operator-registration modules (see the module docstring)."""
    for name in _STUBBED:
        sys.modules.setdefault(name, types.ModuleType(name))


def import_timm():
    """Return the `timm` module, or skip the calling test with the reason it cannot be imported (fail it in CI:
    tests/_ci.py)."""
    stub_torchvision()
    try:
        import timm
    except ImportError as e:
        unavailable(f"timm is not importable ({e}); install it for reference tests: "
                    "pip install timm==1.0.31 torchvision==0.28.0 --no-deps")
    except RuntimeError as e:  # a torchvision/torch operator mismatch beyond the stubbed modules
        unavailable(f"timm import failed against this torch build ({e})")
    return timm


def import_transformers():
    """Return the `transformers` module with SwiftFormer importable, or skip the calling test saying why (fail
    it in CI)."""
    stub_torchvision()
    try:
        import transformers
        from transformers import SwiftFormerConfig, SwiftFormerForImageClassification  # noqa: F401
    except ImportError as e:
        unavailable(f"transformers is not importable ({e}); install it for reference tests: "
                    "pip install -c .ci/constraints.txt transformers")
    except RuntimeError as e:
        unavailable(f"transformers import failed against this torch build ({e})")
    return transformers
