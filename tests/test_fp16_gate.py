"""An fp16 target of a model that would overflow in fp16 fails its hop with the module named (issue 8)."""
import torch

import vitedge
from vitedge.models import make_trained_like
from vitedge.models.reduced import reduced

TINY = reduced("swiftformer")


def test_fp16_overflow_fails_the_hop_and_names_the_module(tmp_path):
    model = make_trained_like(vitedge.create_model("swiftformer_xs", **TINY), seed=0).eval()
    with torch.no_grad():  # logits beyond fp16's 65504: the folded head overflows in fp16
        model.head.weight.mul_(1e6)
        model.dist_head.weight.mul_(1e6)
    rep = vitedge.export(model, targets="onnx", precision="fp16", imgsz=64, samples=6, out=tmp_path / "out")
    hop = rep.hop("onnx-fp16")
    assert hop.status == "failed" and "fp16 is unsafe" in hop.reason and "65504" in hop.reason
    assert hop.diverging_module == "head"
    assert rep.exit_code == 1
    assert rep.hop("onnx-simplified").status == "passed"  # the fp32 base graph itself is fine
    assert rep.reparam.fp16["overflowing_modules"]


def test_safe_model_passes_fp16_with_analysis_recorded(tmp_path):
    model = make_trained_like(vitedge.create_model("swiftformer_xs", **TINY), seed=0).eval()
    rep = vitedge.export(model, targets="onnx", precision="fp16", imgsz=64, samples=6, out=tmp_path / "out")
    assert rep.hop("onnx-fp16").status == "passed", rep.hop("onnx-fp16").reason
    assert rep.reparam.fp16 is not None and not rep.reparam.fp16["overflowing_modules"]
    assert (tmp_path / "out" / "swiftformer_xs.fp16.onnx").exists()
