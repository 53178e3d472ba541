"""Checkpoints as users hold them: Hugging Face transformers save_pretrained folders (cross-checked against
transformers' own SwiftFormerForImageClassification), their weight files and shards, the class count from the
checkpoint in every layout, and the folder's errors."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vitedge.cli import main
from vitedge.errors import CheckpointError
from vitedge.exporter.reparam.build_forms import build_train_form
from vitedge.models import create_model, make_trained_like
from vitedge.models.checkpoints import identify
from vitedge.models.reduced import reduced
from vitedge.tests._ci import require
from vitedge.tests._timm import import_transformers

_SWIFT = reduced("swiftformer")
TINY = {"depths": _SWIFT["layers"], "embed_dims": _SWIFT["embed_dims"]}  # in config.json's names
LABELS = ["cat", "dog", "bird"]
PREPROCESSOR = {"image_processor_type": "ViTImageProcessor", "do_resize": True, "size": {"height": 64, "width": 64},
                "resample": 2, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
                "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}


def transformers_model(labels=LABELS, seed: int = 0, **config):
    """transformers' own SwiftFormer classifier with random weights, non-trivial BatchNorm statistics and layer
    scales (so a wrong remap, a missing fold or the wrong attention shows in the logits)."""
    tf = import_transformers()
    torch.manual_seed(seed)
    cfg = tf.SwiftFormerConfig(**{**TINY, **config}, num_labels=len(labels), id2label=dict(enumerate(labels)),
                               label2id={n: i for i, n in enumerate(labels)})
    model = tf.SwiftFormerForImageClassification(cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, t in model.named_parameters():
            if "layer_scale" in name:
                t.copy_(0.5 + 0.3 * torch.rand(t.shape, generator=g))
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(0.3 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
                m.weight.copy_(1 + 0.2 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.2 * torch.randn(m.bias.shape, generator=g))
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(transformers model, its save_pretrained folder with a preprocessor_config.json)."""
    model = transformers_model()
    folder = tmp_path_factory.mktemp("hf") / "swiftformer-tiny"
    model.save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    return model, folder


def _logits(model, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return model(x).logits.double().numpy()


def test_a_transformers_folder_exports_with_no_flags_and_matches_transformers_forward(saved, tmp_path):
    import onnxruntime as ort

    from vitedge.targets.graph.metadata import read_metadata

    model, folder = saved
    out = tmp_path / "out"
    assert main(["-q", "export", "--checkpoint", str(folder), "--out", str(out), "--samples", "8"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["model"] == "swiftformer_xs" and report["imgsz"] == 64  # the preprocessor's size
    assert report["overrides"] == {"attn_weights": "softmax", "layers": TINY["depths"],
                                   "embed_dims": TINY["embed_dims"], "num_classes": 3}
    assert report["from_checkpoint"]["layout"] == "transformers"
    onnx_path = out / "swiftformer_xs.onnx"
    meta = read_metadata(onnx_path)
    assert meta["labels"] == LABELS
    # the folder's preprocessor_config.json is the recipe used and recorded
    want = {"mean": [0.5] * 3, "std": [0.5] * 3, "crop_pct": 1.0, "interpolation": "bilinear", "crop_mode": "squash"}
    for where in (report["preprocess"], meta["preprocess"]):
        assert {k: where[k] for k in want} == want and where["source"].endswith("preprocessor_config.json")
    assert meta["mean"] == [0.5] * 3 and meta["std"] == [0.5] * 3

    x = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    got = np.concatenate([sess.run(None, {"image": x[i:i + 1].numpy()})[0] for i in range(len(x))])
    ref = _logits(model, x)
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max(), (got, ref)


def test_the_weight_file_a_bin_file_and_shards_load_like_the_folder(saved, tmp_path):
    model, folder = saved
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    ref = _logits(model, x)
    (tmp_path / "bin").mkdir()  # transformers 5 writes safetensors only; older versions wrote pytorch_model.bin
    (tmp_path / "bin" / "config.json").write_text((folder / "config.json").read_text())
    torch.save(model.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    model.save_pretrained(tmp_path / "shards", max_shard_size="100KB")
    assert (tmp_path / "shards" / "model.safetensors.index.json").is_file()
    for ckpt in (folder, folder / "model.safetensors", tmp_path / "bin", tmp_path / "bin" / "pytorch_model.bin",
                 tmp_path / "shards"):
        loaded = build_train_form(None, ckpt)
        assert loaded.name == "swiftformer_xs" and list(loaded.labels) == LABELS, ckpt
        with torch.no_grad():
            out = loaded.model(x).double().numpy()
        assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max(), ckpt


def test_a_bare_transformers_state_dict_gets_the_port_attention_and_its_class_count(saved, tmp_path):
    from safetensors.torch import save_file

    model, _ = saved
    path = tmp_path / "weights.safetensors"  # no config.json beside it
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    found = identify(path, "swiftformer_xs", {"layers": TINY["depths"], "embed_dims": TINY["embed_dims"]})
    assert found.layout == "transformers" and found.overrides["attn_weights"] == "softmax"
    assert found.overrides["num_classes"] == 3 and "classifier head" in found.notes["num_classes"]


def _folder(tmp_path, config: dict, weights: bool = True):
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    if weights:
        (folder / "model.safetensors").write_bytes(b"")  # never read: the config is refused first
    return folder


def _export_error(capsys, *argv) -> str:
    assert main(["-q", "export", *argv, "--out", "never-written"]) == 2
    return capsys.readouterr().err


def test_a_model_that_disagrees_with_the_folder_names_both(tmp_path, capsys):
    folder = _folder(tmp_path, {"model_type": "swiftformer", "depths": [3, 3, 6, 4], "embed_dims": [48, 56, 112, 220]})
    err = _export_error(capsys, "--model", "swiftformer_s", "--checkpoint", str(folder))
    assert "--model swiftformer_s" in err and "swiftformer_xs" in err and "config.json" in err, err
    assert err.count("\n") == 1


def test_a_folder_of_another_model_type_names_what_is_supported(tmp_path, capsys):
    err = _export_error(capsys, "--checkpoint", str(_folder(tmp_path, {"model_type": "vit"})))
    assert "'vit'" in err and "swiftformer (SwiftFormerForImageClassification)" in err and "SimA" in err, err


def test_folder_errors_say_what_is_missing(tmp_path, capsys):
    err = _export_error(capsys, "--checkpoint", str(_folder(tmp_path, {"model_type": "swiftformer"}, weights=False)))
    assert "model.safetensors" in err and "config.json" in err, err
    (tmp_path / "plain").mkdir()
    err = _export_error(capsys, "--model", "swiftformer_xs", "--checkpoint", str(tmp_path / "plain"))
    assert "is a directory, not a checkpoint file" in err, err
    err = _export_error(capsys, "--checkpoint", str(tmp_path / "nowhere.pth"))
    assert "--model is needed" in err or "not found" in err, err


def test_a_sharded_index_missing_a_shard_names_it(saved, tmp_path):
    model, _ = saved
    model.save_pretrained(tmp_path / "s", max_shard_size="100KB")
    index = json.loads((tmp_path / "s" / "model.safetensors.index.json").read_text())
    gone = sorted(set(index["weight_map"].values()))[-1]
    (tmp_path / "s" / gone).unlink()
    with pytest.raises(CheckpointError, match=gone):
        identify(tmp_path / "s")


def test_a_fine_tuned_official_checkpoint_with_ten_classes_exports_without_set(tmp_path):
    """The head's shape says 10 classes: built with them, the report says so (official layout, full XS)."""
    ten = make_trained_like(create_model("swiftformer_xs", num_classes=10), 3)
    path = tmp_path / "ten.pth"
    torch.save({"model": ten.state_dict(), "epoch": 299}, path)
    loaded = build_train_form("swiftformer_xs", path)
    assert loaded.overrides == {"num_classes": 10} and loaded.model.head.out_features == 10
    assert loaded.from_checkpoint["layout"] == "official"
    assert "10 from the checkpoint's classifier head" in loaded.from_checkpoint["num_classes"]
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(loaded.model(x), ten.eval()(x))


def test_the_user_class_count_wins_and_a_timm_layout_head_is_read_too(tmp_path):
    from vitedge.models.swiftformer import _timm_key

    src = create_model("swiftformer_xs", num_classes=7)
    timm_names = {_to_timm(k): v for k, v in src.state_dict().items()}
    assert all(_timm_key(t) == k for t, k in zip(timm_names, src.state_dict()))  # (the inverse is right)
    path = tmp_path / "timm.pth"
    torch.save(timm_names, path)
    found = identify(path, "swiftformer_xs")
    assert found.layout == "timm" and found.overrides == {"num_classes": 7}
    assert "num_classes" not in identify(path, "swiftformer_xs", {"num_classes": 7}).notes


def _to_timm(k: str) -> str:
    """Official -> timm names (the inverse of models/swiftformer._timm_key)."""
    import re

    k = re.sub(r"^patch_embed\.", "stem.", re.sub(r"^dist_head\.", "head_dist.", k))
    m = re.match(r"network\.(\d+)\.(.*)", k)
    if m:
        i, rest = int(m[1]), m[2]
        k = f"stages.{i // 2}.blocks.{rest}" if i % 2 == 0 else f"stages.{(i + 1) // 2}.downsample.{rest}"
    k = k.replace(".attn.Proj.", ".attn.proj.")
    return re.sub(r"\.(layer_scale(?:_[12])?)$", r".\1.gamma", k)


def test_an_hf_hub_repo_of_a_transformers_folder_comes_whole_from_the_cache(saved, tmp_path, monkeypatch):
    require("huggingface_hub", "the [hub] extra (huggingface_hub) is needed for hub sources")
    from vitedge.tests.test_checkpoint_sources import put_in_cache

    _, folder = saved
    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    for f in ("config.json", "preprocessor_config.json", "model.safetensors"):
        put_in_cache(cache, "acme/swiftformer-tiny", f, (folder / f).read_bytes())
    for spec in ("hf-hub:acme/swiftformer-tiny", "hf-hub:acme/swiftformer-tiny:model.safetensors"):
        found = identify(spec)
        assert (found.name, found.layout, found.labels, found.imgsz) == ("swiftformer_xs", "transformers",
                                                                     tuple(LABELS), 64), spec
        assert found.recipe.crop_mode == "squash" and found.digest() == identify(folder).digest()


@pytest.mark.parametrize("rewrites", [True, False, ["l2_normalize_rsqrt"]])
def test_the_softmax_attention_folds_exactly_in_every_layout(rewrites):
    from vitedge.exporter.reparam.build_forms import build_deploy_form

    model = make_trained_like(create_model("swiftformer_xs", layers=TINY["depths"], embed_dims=TINY["embed_dims"],
                                           num_classes=3, attn_weights="softmax"), 4).eval()
    _, deploy64 = build_deploy_form(model, 32, rewrites=rewrites)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model.double()(x)
        assert torch.allclose(deploy64(x), want, rtol=1e-9, atol=1e-12 * want.abs().max())
        model.float()
        other = create_model("swiftformer_xs", layers=TINY["depths"], embed_dims=TINY["embed_dims"], num_classes=3)
        other.load_state_dict(model.state_dict())
        assert not torch.allclose(other.double().eval()(x), want)  # (the l2 attention computes something else)


@pytest.mark.parametrize("rewrites", [True, False, ["l2_normalize_rsqrt"]])
def test_the_softmax_port_takes_the_executorch_delegation_rewrites_in_every_layout(rewrites):
    """The transformers port's softmax attention (a * reciprocal(sum) in the exported graph) went through the
    delegation rewrites into a sum of a division that carried no shape: `KeyError: 'val'`. Every deploy-form
    layout now rewrites, and the float64 gate holds."""
    from vitedge.exporter.reparam.build_forms import build_deploy_form
    from vitedge.targets.executorch.delegable import GATE_RTOL, gate, make_delegable

    model = make_trained_like(create_model("swiftformer_xs", layers=TINY["depths"], embed_dims=TINY["embed_dims"],
                                           num_classes=3, attn_weights="softmax"), 4).eval()
    deploy, _ = build_deploy_form(model, 32, rewrites=rewrites)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    before = torch.export.export(deploy.eval(), (x,)).module()
    import copy

    after, done = make_delegable(copy.deepcopy(before))
    assert done and gate(before, after, x) <= GATE_RTOL


def test_a_transformers_folder_exports_to_every_target_here(saved, tmp_path):
    """The transformers port on every target that runs here (TensorRT needs an NVIDIA GPU): ONNX, CoreML (the MIL
    interpreter) and ExecuTorch (XNNPACK, its delegation rewrites on), each hop passed."""
    _, folder = saved
    out = tmp_path / "out"
    assert main(["-q", "export", "--checkpoint", str(folder), "--target", "onnx,coreml,executorch", "--out", str(out),
                 "--samples", "8"]) == 0
    report = json.loads((out / "report.json").read_text())
    hops = {h["hop"]: h["status"] for h in report["parity"]}
    assert {"onnx", "coreml", "executorch"} <= set(hops) and set(hops.values()) == {"passed"}, hops
    assert report["artifacts"]["executorch"]["info"]["rewrites"]["applied"], report["artifacts"]["executorch"]["info"]


def test_package_takes_the_executorch_rewrites_flag(saved, tmp_path, monkeypatch, capsys):
    """`vitedge package --target executorch --executorch-rewrites off` reaches the export as export's own flag
    does; on a CoreML bundle the flag is refused before any work."""
    from vitedge.exporter.packaging import package_android

    seen = {}

    def export(settings, **kw):
        seen["options"] = settings.options
        raise KeyboardInterrupt  # stop before any work: what reached the export is what is checked

    monkeypatch.setattr(package_android, "export", export)
    _, folder = saved
    assert main(["-q", "package", "--target", "executorch", "--checkpoint", str(folder), "--executorch-rewrites",
                 "off", "--out", str(tmp_path / "a.zip")]) != 0  # interrupted
    assert seen["options"] == {"executorch_rewrites": "off"}
    assert main(["-q", "package", "--checkpoint", str(folder), "--executorch-rewrites", "off",
                 "--out", str(tmp_path / "b.zip")]) == 2
    assert "--executorch-rewrites applies to --target executorch only" in capsys.readouterr().err
