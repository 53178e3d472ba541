"""load_checkpoint: official layouts and containers, key remaps, precision, formats."""
from __future__ import annotations

import argparse
import re
import sys
import types
from collections import OrderedDict

import pytest
import torch
from safetensors.torch import save_file

from vitedge.models import create_model, list_models, make_trained_like
from vitedge.models.checkpoints import LoadResult, load_checkpoint
from vitedge.errors import CheckpointError
from vitedge.models.flops import count_params, meta_model

from vitedge.models.reduced import reduced
from vitedge.tests.conftest import golden_path

# Reduced configs (the golden fixtures' overrides) for tests that need real numbers.
MINI = {
    "swiftformer_xs": reduced("swiftformer"),
    "slab_deit_tiny": reduced("slab_deit"),
    "prepbn_deit_tiny": reduced("prepbn_deit"),
    "slab_swin_tiny": reduced("slab_swin"),
    "sima_tiny_12_p16": reduced("sima"),
}
SMALL_PARAMS = 7_000_000  # variants up to this size round-trip real seeded weights through a file


def mini(name: str, seed: int | None = 0, **extra) -> torch.nn.Module:
    model = create_model(name, **{**MINI[name], **extra})
    if seed is not None:
        make_trained_like(model, seed)
    return model.eval()


def assert_same_state(model: torch.nn.Module, ref: dict) -> None:
    got = model.state_dict()
    assert list(got) == list(ref)
    for k, v in ref.items():
        assert got[k].dtype == v.dtype or v.dtype in (torch.float16, torch.bfloat16), k
        assert torch.equal(got[k], v.to(got[k].dtype)), k


def _run(model, x=None):
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0)) if x is None else x
    with torch.no_grad():
        return model.eval()(x)


# ------------------------------------------------------------------------------------------------
# Every registered name: its official layout loads with no missing/unexpected key and no remap
# ------------------------------------------------------------------------------------------------
def seeded_like(model: torch.nn.Module, seed: int) -> OrderedDict:
    """A state_dict with the model's keys, shapes and dtypes and seeded random values (cheap at any size)."""
    g = torch.Generator().manual_seed(seed)
    return OrderedDict((k, torch.randn(v.shape, generator=g).to(v.dtype) if v.is_floating_point()
                        else torch.randint(0, 1000, v.shape, generator=g).to(v.dtype))
                       for k, v in model.state_dict().items())


@pytest.mark.parametrize("name", list_models())
def test_official_layout_of_every_variant_loads_cleanly(name, tmp_path):
    model = meta_model(name)  # shapes only; the family modules define the official layout
    if count_params(model) <= SMALL_PARAMS:  # real seeded values through a file
        model.to_empty(device="cpu")
        ref = seeded_like(model, seed=1)
        path = tmp_path / f"{name}.pth"
        torch.save({"model": ref, "epoch": 299}, path)
        result = load_checkpoint(model, path)
        assert_same_state(model, ref)
        assert result.metadata == {"epoch": 299} and result.format == "torch-zip"
    else:  # big variants: keys and shapes only, on the meta device (the model is reused as its own source)
        ref = OrderedDict(model.state_dict())
        result = load_checkpoint(model, {"model": ref})
    assert result.ok and result.remaps == [] and result.source_key == "model"
    assert result.loaded == len(ref)


GOLDEN = [("swiftformer_tiny", "swiftformer_xs"), ("slab_deit_mini", "slab_deit_tiny"),
          ("prepbn_deit_mini", "prepbn_deit_tiny"), ("slab_swin_mini", "slab_swin_tiny"),
          ("sima_mini", "sima_tiny_12_p16"), ("sima_mini_notn", "sima_nano_12_p16")]


@pytest.mark.parametrize("fixture,name", GOLDEN)
def test_official_golden_checkpoints_load_identically(fixture, name):
    """Checkpoints written by the official code: safe loading gives exactly torch's weights_only result."""
    path = golden_path(f"{fixture}.pth")
    io_name = f"{fixture}_224_io.pt" if fixture.startswith("sima") else f"{fixture}_io.pt"
    overrides = torch.load(golden_path(io_name), weights_only=True)["overrides"]
    model = create_model(name, **overrides)
    result = load_checkpoint(model, path)
    assert result.ok and result.remaps == [] and result.format == "torch-zip"
    assert result.metadata == {"epoch": 0} and result.container_keys == ["model", "epoch"]
    assert_same_state(model, torch.load(path, weights_only=True)["model"])


# ------------------------------------------------------------------------------------------------
# Official training containers
# ------------------------------------------------------------------------------------------------
def _training_container(model, ema_seed: int) -> dict:
    """What SwiftFormer's / SimA's main.py save (DeiT recipe), with an `args` Namespace."""
    ema = make_trained_like(mini("swiftformer_xs", seed=None), ema_seed).state_dict()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()(torch.randn(2, 3, 64, 64))[0].sum().backward()
    opt.step()
    model.eval()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "lr_scheduler": {"last_epoch": 299},
            "epoch": 299, "model_ema": ema, "scaler": {"scale": 65536.0, "_growth_tracker": 0},
            "args": argparse.Namespace(model="SwiftFormer_XS", lr=1e-3, drop_path=0.0, epochs=300,
                                       output_dir="out", distillation_type="hard", input_size=224)}


def test_swiftformer_training_container_with_argparse_namespace(tmp_path):
    src = mini("swiftformer_xs", seed=2)
    ck = _training_container(src, ema_seed=3)
    path = tmp_path / "checkpoint.pth"
    torch.save(ck, path)
    with pytest.raises(Exception):  # torch's own safe mode rejects the Namespace: why this loader exists
        torch.load(path, weights_only=True)

    dst = mini("swiftformer_xs", seed=None)
    result = load_checkpoint(dst, path)
    assert result.source_key == "model" and result.ok
    assert_same_state(dst, ck["model"])
    assert result.placeholders == ["argparse.Namespace"]
    assert result.metadata["epoch"] == 299
    assert result.metadata["args"] == vars(ck["args"])
    assert "optimizer" not in result.metadata and "optimizer" in result.container_keys

    ema = mini("swiftformer_xs", seed=None)
    assert load_checkpoint(ema, path, use_ema=True).source_key == "model_ema"
    assert_same_state(ema, ck["model_ema"])


def test_slab_container_with_unimportable_config_class(tmp_path, monkeypatch):
    """SLAB saves its yacs CfgNode; the class is recorded, never imported or called."""
    pkg, modname = "vitedge_test_missing_yacs", "vitedge_test_missing_yacs.config"

    class CfgNode(dict):  # a dict subclass with instance attributes, like yacs.config.CfgNode
        def __init__(self, init=None):
            super().__init__(init or {})
            self.__dict__["__immutable__"] = True
            self.__dict__["new_allowed"] = False

    CfgNode.__module__, CfgNode.__qualname__ = modname, "CfgNode"
    fake = types.ModuleType(modname)
    fake.CfgNode = CfgNode
    src = mini("slab_deit_tiny", seed=4)
    config = CfgNode({"MODEL": CfgNode({"TYPE": "deits", "NAME": "slab_deit_t"}),
                      "TRAIN": CfgNode({"EPOCHS": 300, "BASE_LR": 5e-4})})
    path = tmp_path / "ckpt_epoch_299.pth"
    with monkeypatch.context() as m:
        m.setitem(sys.modules, pkg, types.ModuleType(pkg))
        m.setitem(sys.modules, modname, fake)
        torch.save({"model": src.state_dict(), "optimizer": {}, "lr_scheduler": {}, "max_accuracy": torch.tensor(74.3),
                    "scaler": {}, "epoch": 299, "config": config}, path)
    assert pkg not in sys.modules and modname not in sys.modules  # unimportable from here on

    dst = mini("slab_deit_tiny", seed=None)
    result = load_checkpoint(dst, path)
    assert_same_state(dst, src.state_dict())
    assert pkg not in sys.modules and modname not in sys.modules  # never imported
    assert result.placeholders == [f"{modname}.CfgNode"]
    assert result.metadata["config"] == {"MODEL": {"TYPE": "deits", "NAME": "slab_deit_t"},
                                         "TRAIN": {"EPOCHS": 300, "BASE_LR": 5e-4}}
    assert result.metadata["max_accuracy"] == pytest.approx(74.3)


# ------------------------------------------------------------------------------------------------
# Prefixes, formats, precision
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("prefix", ["module.", "_orig_mod."])
def test_wrapper_prefix_is_stripped_and_reported(prefix, tmp_path):
    src = mini("sima_tiny_12_p16", seed=5)
    path = tmp_path / "ddp.pth"
    torch.save({"model": OrderedDict((prefix + k, v) for k, v in src.state_dict().items())}, path)
    dst = mini("sima_tiny_12_p16", seed=None)
    result = load_checkpoint(dst, path)
    assert result.remaps == [f"stripped the {prefix!r} prefix"]
    assert_same_state(dst, src.state_dict())


def test_safetensors_file(tmp_path):
    src = mini("slab_swin_tiny", seed=6)
    path = tmp_path / "model.safetensors"
    save_file(src.state_dict(), str(path), metadata={"epoch": "299"})
    dst = mini("slab_swin_tiny", seed=None)
    result = load_checkpoint(dst, path)
    assert result.format == "safetensors" and result.source_key is None and result.ok
    assert result.metadata == {"epoch": "299"}
    assert_same_state(dst, src.state_dict())
    assert torch.equal(_run(dst), _run(src))


def test_legacy_non_zip_torch_file(tmp_path):
    src = mini("swiftformer_xs", seed=7)
    path = tmp_path / "legacy.pth"
    torch.save({"model": src.state_dict(), "args": argparse.Namespace(lr=0.1)}, path,
               _use_new_zipfile_serialization=False)
    dst = mini("swiftformer_xs", seed=None)
    result = load_checkpoint(dst, path)
    assert result.format == "torch-legacy" and result.metadata["args"] == {"lr": 0.1}
    assert_same_state(dst, src.state_dict())


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
@pytest.mark.parametrize("protocol", [1, 4, 5])
def test_other_pickle_protocols(protocol, zip_format, tmp_path):
    src = mini("swiftformer_xs", seed=15)
    path = tmp_path / "p.pth"
    torch.save({"model": src.state_dict(), "args": argparse.Namespace(lr=0.1, sizes=(224, 256))}, path,
               pickle_protocol=protocol, _use_new_zipfile_serialization=zip_format)
    dst = mini("swiftformer_xs", seed=None)
    assert load_checkpoint(dst, path).metadata["args"] == {"lr": 0.1, "sizes": [224, 256]}
    assert_same_state(dst, src.state_dict())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_checkpoint_is_cast_to_float32(dtype, tmp_path):
    src = mini("prepbn_deit_tiny", seed=8)
    half = OrderedDict((k, v.to(dtype) if v.is_floating_point() else v) for k, v in src.state_dict().items())
    path = tmp_path / "half.pth"
    torch.save({"state_dict": half}, path)
    dst = mini("prepbn_deit_tiny", seed=None)
    result = load_checkpoint(dst, path)
    n_float = sum(v.is_floating_point() for v in half.values())
    assert result.cast == {str(dtype).split(".")[1]: n_float} and result.source_key == "state_dict"
    for k, v in dst.state_dict().items():
        assert v.dtype == src.state_dict()[k].dtype
        assert torch.equal(v, half[k].to(v.dtype)), k


# ------------------------------------------------------------------------------------------------
# SLAB norm layouts: LinearNorm (X.norm1.*, X.norm2.{alpha,bn.*}, X.{warm,iter,total_step}) <-> RepBN
# ------------------------------------------------------------------------------------------------
def test_linearnorm_checkpoint_into_repbn_model():
    src = mini("slab_deit_tiny", seed=9)  # LinearNorm layout
    sd = src.state_dict()
    dst = mini("slab_deit_tiny", seed=None, norm_layer="repbn")
    result = load_checkpoint(dst, {"model": sd})
    assert len(result.remaps) == 1 and result.remaps[0].startswith("SLAB LinearNorm layout -> RepBN model (5 norms")
    got = dst.state_dict()
    assert torch.equal(got["blocks.0.norm2.alpha"], sd["blocks.0.norm2.norm2.alpha"])
    assert torch.equal(got["norm.bn.running_var"], sd["norm.norm2.bn.running_var"])
    assert not any(k.endswith(("warm", "iter", "total_step")) or ".norm1.norm1." in k for k in got)
    assert torch.equal(_run(dst), _run(src))  # eval LinearNorm is its RepBN


def test_repbn_checkpoint_into_linearnorm_model_gets_a_finished_schedule():
    src = mini("slab_deit_tiny", seed=10, norm_layer="repbn")
    dst = mini("slab_deit_tiny", seed=None)
    dst.blocks[0].norm1.iter.fill_(123)  # must be overwritten by the finished schedule
    result = load_checkpoint(dst, {"model": src.state_dict()})
    assert len(result.remaps) == 1 and result.remaps[0].startswith("SLAB RepBN layout -> LinearNorm model (5 norms")
    for name, buf in dst.state_dict().items():
        if name.endswith((".warm", ".iter")):
            assert int(buf) == 0, name
        if name.endswith(".total_step"):
            assert int(buf) == 60000, name
    assert torch.equal(dst.state_dict()["blocks.1.norm1.norm2.bn.weight"], src.state_dict()["blocks.1.norm1.bn.weight"])
    assert torch.equal(_run(dst), _run(src))


def test_linearnorm_buffers_are_loaded_as_stored():
    src = mini("slab_deit_tiny", seed=11)
    for m in src.modules():
        if hasattr(m, "total_step"):
            m.iter.fill_(30000)  # an unfinished schedule: the loader must not "fix" it
    dst = mini("slab_deit_tiny", seed=None)
    result = load_checkpoint(dst, {"model": src.state_dict()})
    assert result.remaps == []
    assert all(int(v) == 30000 for k, v in dst.state_dict().items() if k.endswith(".iter"))


# ------------------------------------------------------------------------------------------------
# timm's SwiftFormer key names (timm 1.0.31 checkpoint_filter_fn, applied here in the forward direction)
# ------------------------------------------------------------------------------------------------
def to_timm_names(sd: dict) -> OrderedDict:
    out = OrderedDict()
    for k, v in sd.items():
        k = k.replace("patch_embed.", "stem.").replace("dist_head.", "head_dist.").replace("attn.Proj.", "attn.proj.")
        k = re.sub(r"\.(layer_scale(?:_[12])?)$", r".\1.gamma", k)
        m = re.match(r"^network\.(\d+)\.(.*)", k)
        if m:
            n, rest = int(m[1]), m[2]
            k = f"stages.{n // 2}.blocks.{rest}" if n % 2 == 0 else f"stages.{n // 2 + 1}.downsample.{rest}"
        out[k] = v
    return out


def test_timm_swiftformer_names_are_remapped(tmp_path):
    src = mini("swiftformer_xs", seed=12)
    timm_sd = to_timm_names(src.state_dict())
    # Names read off timm's SwiftFormer module tree (timm 1.0.31).
    for k in ("stem.3.weight", "stages.0.blocks.0.attn.proj.weight", "stages.0.blocks.0.layer_scale_1.gamma",
              "stages.2.blocks.0.layer_scale.gamma", "stages.2.blocks.1.local_representation.layer_scale.gamma",
              "stages.1.downsample.proj.weight", "stages.3.downsample.norm.running_var", "head_dist.weight"):
        assert k in set(timm_sd), k
    path = tmp_path / "timm.pth"
    torch.save(timm_sd, path)
    dst = mini("swiftformer_xs", seed=None)
    result = load_checkpoint(dst, path)
    assert len(result.remaps) == 1 and result.remaps[0].startswith("timm SwiftFormer key names -> official")
    assert result.source_key is None
    assert_same_state(dst, src.state_dict())


def test_timm_names_on_a_full_size_variant_match_keys_and_shapes():
    ref = meta_model("swiftformer_l3").state_dict()
    dst = meta_model("swiftformer_l3")
    result = load_checkpoint(dst, {"model": to_timm_names(ref)})
    assert result.ok and result.loaded == len(ref) == 436  # timm's swiftformer_l3 has 436 state_dict entries


# ------------------------------------------------------------------------------------------------
# Strictness and hints
# ------------------------------------------------------------------------------------------------
def test_non_strict_loads_what_fits_and_reports_the_rest():
    src = mini("swiftformer_xs", seed=13)
    sd = src.state_dict()
    sd.pop("norm.weight")
    sd["extra.weight"] = torch.zeros(3)
    sd["head.weight"] = torch.zeros(7, 48)
    dst = mini("swiftformer_xs", seed=None)
    before = dst.state_dict()["head.weight"].clone()
    result = load_checkpoint(dst, sd, strict=False)
    assert isinstance(result, LoadResult) and not result.ok
    assert result.missing_keys == ["norm.weight"] and result.unexpected_keys == ["extra.weight"]
    assert result.mismatched_keys == [("head.weight", (7, 48), (10, 48))]
    assert torch.equal(dst.state_dict()["head.weight"], before)
    assert torch.equal(dst.state_dict()["head.bias"], sd["head.bias"])
    with pytest.raises(CheckpointError, match=r"1 missing \(norm.weight\), 1 unexpected \(extra.weight\), "
                                              r"1 shape mismatches \(head.weight: checkpoint \[7, 48\]"):
        load_checkpoint(mini("swiftformer_xs", seed=None), sd)


def test_stray_non_tensor_entries_are_ignored_and_reported():
    src = mini("swiftformer_xs", seed=14)
    sd = OrderedDict(src.state_dict())
    sd["_ema_updates"] = 1200  # e.g. a counter some trainers keep next to the weights
    dst = mini("swiftformer_xs", seed=None)
    result = load_checkpoint(dst, {"state_dict_ema": sd}, use_ema=True)
    assert result.source_key == "state_dict_ema"
    assert result.remaps == ["ignored 1 non-tensor entries (_ema_updates)"]
    assert_same_state(dst, src.state_dict())


def test_strict_error_names_the_variant_the_checkpoint_fits():
    sd = meta_model("swiftformer_s").state_dict()
    with pytest.raises(CheckpointError, match=r"does not fit swiftformer_xs: .* the checkpoint fits swiftformer_s"):
        load_checkpoint(meta_model("swiftformer_xs"), sd)


def test_strict_error_suggests_num_classes_for_a_finetuned_head():
    sd = meta_model("sima_nano_12_p16", num_classes=10).state_dict()
    with pytest.raises(CheckpointError, match=r"has 10 classes: build the model with num_classes=10 "
                                              r"\(`--set num_classes=10`\)") as e:
        load_checkpoint(meta_model("sima_nano_12_p16"), sd)
    # the Python API's own fix is offered to API callers, never on the command line
    assert "strict=False" in str(e.value) and "strict=False" not in e.value.cli_text()


def test_cli_checkpoint_errors_give_cli_hints_only(tmp_path, capsys):
    from vitedge.cli import main

    path = tmp_path / "wide.pth"
    sd = create_model("sima_nano_12_p16").state_dict()
    sd["norm.weight"] = torch.ones(sd["norm.weight"].shape[0] + 1)  # one mis-shaped tensor, not the head
    torch.save({"model": sd}, path)
    assert main(["-q", "export", "--model", "sima_nano_12_p16", "--checkpoint", str(path), "--out",
                 str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "norm.weight" in err and "--set KEY=VALUE" in err, err
    assert "strict=False" not in err and "create_model(" not in err and "closest" not in err, err
