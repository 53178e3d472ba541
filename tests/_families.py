"""One small config per family, shared by the exporter tests (tests/test_exporters.py, test_exporter_choice.py):
the reduced configs the family test modules use, at a size each accepts."""
from __future__ import annotations

# family: (model, reduced overrides, imgsz)
CASES = {
    "swiftformer": ("swiftformer_xs", dict(layers=[1, 1, 2, 1], embed_dims=[16, 24, 32, 48], num_classes=10), 64),
    "slab_deit": ("slab_deit_tiny", dict(embed_dim=64, depth=2, num_heads=2, num_classes=10), 224),
    "slab_swin": ("slab_swin_tiny", dict(embed_dim=16, depths=[1, 1, 2, 1], num_heads=[1, 2, 4, 8], mlp_ratio=2.0,
                                         num_classes=10), 224),
    "sima": ("sima_nano_12_p16", dict(embed_dim=64, depth=2, num_heads=2, num_classes=10), 80),
    "slab_pvt": ("slab_pvt_tiny", dict(img_size=64, embed_dims=[16, 32, 48, 64], num_heads=[1, 2, 3, 4],
                                       depths=[1, 2, 1, 1], num_classes=10), 64),
    "slab_cswin": ("slab_cswin_tiny", dict(img_size=64, embed_dim=16, depth=[1, 2, 1, 1], num_heads=[2, 2, 4, 4],
                                           split_size=[1, 2, 2, 2], la_split_size="8-4-4-2", attn_type="LLLS",
                                           num_classes=10), 64),
    "sima_deit": ("sima_deit_tiny", dict(img_size=64, embed_dim=64, depth=2, num_heads=4, num_classes=10), 64),
}
