"""One table of reduced model configurations: each family at the golden fixtures' size (seconds to build, export and
judge), shared by the tests, the benchmarks' --quick runs and the examples, so a config is typed once.

    reduced("swiftformer")                   # a fresh overrides dict: create_model("swiftformer_xs", **it)
    reduced("swiftformer", num_classes=3)    # with changes
    REDUCED["sima"].model, .imgsz            # the registered model it is for, and a size it accepts

Two entries differ where the tests need both: `sima` (64 wide, 2 heads: head_dim 32) and `sima_narrow` (32 wide,
1 head); `slab_cswin` (the default attention type) and `slab_cswin_two_branch` (`attn_type="LLLS"`, locality split
8-4-4-2). The Swin entries set `drop_path_rate=0.0`, which some copies left at the model's 0.1: it acts in training
only, so no evaluated number changes. No torch import: a table of plain data.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Reduced:
    model: str                       # the registered model the overrides are for
    overrides: dict = field(default_factory=dict)
    imgsz: int = 224                 # a size the config accepts (the golden fixture's)

    def kwargs(self, **changes) -> dict:
        """A fresh copy of the overrides (lists included: callers may change them), with `changes` applied."""
        return {**copy.deepcopy(self.overrides), **changes}


_PVT = dict(img_size=64, embed_dims=[16, 32, 48, 64], num_heads=[1, 2, 3, 4], depths=[1, 2, 1, 1], num_classes=10)
_CSWIN = dict(img_size=64, embed_dim=16, depth=[1, 2, 1, 1], num_heads=[2, 2, 4, 4], split_size=[1, 2, 2, 2])
_DEIT = dict(embed_dim=64, depth=2, num_heads=2, num_classes=10)

REDUCED = {
    "swiftformer": Reduced("swiftformer_xs", dict(layers=[1, 1, 2, 1], embed_dims=[16, 24, 32, 48], num_classes=10),
                           64),
    "slab_deit": Reduced("slab_deit_tiny", _DEIT, 224),
    "prepbn_deit": Reduced("prepbn_deit_tiny", _DEIT, 224),
    "slab_swin": Reduced("slab_swin_tiny", dict(embed_dim=16, depths=[1, 1, 2, 1], num_heads=[1, 2, 4, 8],
                                                mlp_ratio=2.0, num_classes=10, drop_path_rate=0.0), 224),
    "prepbn_swin": Reduced("prepbn_swin_tiny", dict(embed_dim=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8],
                                                    mlp_ratio=2.0, num_classes=10, drop_path_rate=0.0), 224),
    "slab_pvt": Reduced("slab_pvt_tiny", _PVT, 64),
    "prepbn_pvt": Reduced("prepbn_pvt_tiny", _PVT, 64),
    "slab_cswin": Reduced("slab_cswin_tiny", dict(_CSWIN, la_split_size="16-8-4-2", num_classes=10), 64),
    "slab_cswin_two_branch": Reduced("slab_cswin_tiny", dict(_CSWIN, la_split_size="8-4-4-2", attn_type="LLLS",
                                                                   num_classes=10), 64),
    "sima": Reduced("sima_nano_12_p16", _DEIT, 64),
    "sima_narrow": Reduced("sima_nano_12_p16", dict(embed_dim=32, depth=2, num_heads=1, num_classes=10), 64),
    "sima_deit": Reduced("sima_deit_tiny", dict(img_size=64, embed_dim=64, depth=2, num_heads=4, num_classes=10), 64),
}


def reduced(name: str, **changes) -> dict:
    """The overrides of `REDUCED[name]` as a fresh dict, with `changes` applied."""
    return REDUCED[name].kwargs(**changes)


def case(name: str, imgsz: int | None = None) -> tuple[str, dict, int]:
    """(model, fresh overrides, imgsz) of `REDUCED[name]`; `imgsz` replaces the entry's size."""
    r = REDUCED[name]
    return r.model, r.kwargs(), imgsz or r.imgsz
