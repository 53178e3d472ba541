"""Your own dense-prediction head on a vitedge backbone, exported and judged output by output.

A small FPN and a segmentation head (written here, plain torch) on SwiftFormer's four feature maps; the module
also returns the FPN's finest map, so it has two outputs. `vitedge.export` folds the embedded backbone in place
(its BatchNorms, layer scales and attention rewrites), gates the whole module in float64, and judges each output
by the noise rule on every target. Run it:

    python examples/dense_head.py [--out runs/dense_head] [--target onnx,coreml,executorch] [--full]

`--full` uses SwiftFormer-XS at 224 (a minute or more); without it a reduced configuration at 64 (seconds).
"""
from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import vitedge
from vitedge.models.reduced import case
from vitedge.models.registry import create_model


class TinyFPN(nn.Module):
    """Lateral 1x1 convs to `width` channels, top-down nearest upsampling and sum, a 3x3 conv on each level."""

    def __init__(self, in_channels: list[int], width: int):
        super().__init__()
        self.lateral = nn.ModuleList(nn.Conv2d(c, width, 1) for c in in_channels)
        self.smooth = nn.ModuleList(nn.Conv2d(width, width, 3, padding=1) for _ in in_channels)

    def forward(self, feats: list[torch.Tensor]) -> list[torch.Tensor]:
        laterals = [conv(f) for conv, f in zip(self.lateral, feats)]
        for i in range(len(laterals) - 1, 0, -1):  # coarse to fine
            laterals[i - 1] = laterals[i - 1] + F.interpolate(laterals[i], size=laterals[i - 1].shape[-2:],
                                                              mode="nearest")
        return [conv(x) for conv, x in zip(self.smooth, laterals)]


class SegmentationModel(nn.Module):
    """backbone -> FPN -> per-pixel class scores at stride 4 (and the FPN's stride-4 map)."""

    vitedge_output_names = ("seg_logits", "fpn_s4")   # the names the artifacts give the two outputs
    vitedge_output_strides = (4, 4)

    def __init__(self, backbone: nn.Module, channels: list[int], classes: int = 5, width: int = 32):
        super().__init__()
        self.backbone = backbone
        self.fpn = TinyFPN(channels, width)
        self.head = nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, classes, 1))

    def forward(self, x: torch.Tensor):
        feats = self.backbone.forward_intermediates(x, (0, 1, 2, 3))   # stride 4, 8, 16, 32 (NCHW)
        fpn = self.fpn(feats)
        return self.head(fpn[0]), fpn[0]


def build(full: bool = False) -> tuple[SegmentationModel, int]:
    """The example model (seeded) and the size it is exported at."""
    torch.manual_seed(0)
    if full:
        name, overrides, imgsz = "swiftformer_xs", {}, 224
    else:
        name, overrides, imgsz = case("swiftformer")
    backbone = create_model(name, **overrides)
    channels = [t.channels for t in backbone.feature_info()]
    return SegmentationModel(backbone, channels).eval(), imgsz


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/dense_head")
    p.add_argument("--target", default="onnx")
    p.add_argument("--samples", type=int, default=None)
    p.add_argument("--full", action="store_true")
    args = p.parse_args(argv)
    model, imgsz = build(args.full)
    report = vitedge.export(model=model, targets=args.target, imgsz=imgsz, out=args.out, samples=args.samples,
                            force=True)
    for hop in report.parity:
        ratios = ", ".join(f"{k} {v:.3g}" for k, v in (hop.outputs or {}).items())
        print(f"{hop.hop:16s} {hop.status:10s} {ratios}")
    print(f"outputs: {report.outputs}")
    return report.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
