"""Untrusted checkpoints: code in the pickle never runs; broken files give one-line CheckpointErrors."""
from __future__ import annotations

import argparse
import builtins
import functools
import os
import pickle
import struct
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch

from vitedge.models import create_model, make_trained_like
from vitedge.models.checkpoints import load_checkpoint
from vitedge.errors import CheckpointError, VitedgeError
from vitedge.models.checkpoints.safe_pickle import UnsafePickleError
from vitedge.models.reduced import reduced

SWIFT_MINI = reduced("swiftformer")
SLAB_MINI = reduced("slab_deit")


@pytest.fixture(scope="module")
def swift_sd():
    return make_trained_like(create_model("swiftformer_xs", **SWIFT_MINI), seed=0).state_dict()


def swift_model():
    return create_model("swiftformer_xs", **SWIFT_MINI)


def one_line_error(exc_info, *patterns: str, kind=CheckpointError) -> str:
    msg = str(exc_info.value)
    assert isinstance(exc_info.value, kind) and isinstance(exc_info.value, VitedgeError)
    assert "\n" not in msg and len(msg) < 700, msg
    for p in patterns:
        assert p in msg, f"{p!r} not in {msg!r}"
    return msg


# ------------------------------------------------------------------------------------------------
# Payloads: each would create `marker` when unpickled by a plain pickle loader
# ------------------------------------------------------------------------------------------------
class Call:
    """Pickles as `func(*args)`: the classic __reduce__ payload."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args

    def __call__(self, *args):  # pickle insists that a reduce target be callable; a nested Call pickles itself
        raise AssertionError("never called here")


def payloads(marker: Path) -> dict:
    m = str(marker)
    return {
        "os.system": Call(os.system, f"touch {m}"),
        "builtins.exec": Call(builtins.exec, f"open({m!r}, 'w').close()"),
        "builtins.eval": Call(builtins.eval, f"open({m!r}, 'w').close()"),
        "builtins.open": Call(builtins.open, m, "w"),
        "subprocess.call": Call(subprocess.call, ["touch", m]),
        "functools.partial": Call(Call(functools.partial, os.system, f"touch {m}")),
        # getattr(Path(marker), 'touch')() - a bound method fetched and called, no import-time tricks
        "pathlib.touch": Call(Call(getattr, Path(m), "touch")),
    }


PAYLOAD_NAMES = list(payloads(Path("x")))
# The callable each refusal must name (as pickle records it).
REFUSED = {"os.system": f"{os.system.__module__}.system",
           "builtins.exec": "builtins.exec", "builtins.eval": "builtins.eval", "builtins.open": "io.open",
           "subprocess.call": "subprocess.call", "functools.partial": "functools.partial",
           "pathlib.touch": "builtins.getattr"}


@pytest.mark.parametrize("kind", PAYLOAD_NAMES)
def test_payloads_are_live_under_plain_pickle(kind, tmp_path):
    """Control: each payload really creates its marker when a normal unpickler runs it."""
    marker = tmp_path / "MARKER"
    data = pickle.dumps(payloads(marker)[kind], protocol=2)
    result = pickle.loads(data)
    if hasattr(result, "close"):
        result.close()
    assert marker.exists()


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
@pytest.mark.parametrize("kind", PAYLOAD_NAMES)
def test_bare_payload_is_refused_and_never_runs(kind, zip_format, tmp_path):
    marker = tmp_path / "MARKER"
    path = tmp_path / "evil.pth"
    torch.save(payloads(marker)[kind], path, _use_new_zipfile_serialization=zip_format)
    with pytest.raises(UnsafePickleError) as e:
        load_checkpoint(swift_model(), path)
    one_line_error(e, "refusing to run code from the checkpoint", f"(it calls {REFUSED[kind]})",
                   "torch.save(model.state_dict()")
    assert not marker.exists()


@pytest.mark.parametrize("kind", PAYLOAD_NAMES)
def test_payload_hidden_in_an_official_looking_container_is_refused(kind, swift_sd, tmp_path):
    marker = tmp_path / "MARKER"
    path = tmp_path / "checkpoint.pth"
    torch.save({"model": swift_sd, "optimizer": {"state": {}, "param_groups": []}, "epoch": 299,
                "model_ema": swift_sd, "scaler": {"scale": 65536.0},
                "lr_scheduler": payloads(marker)[kind],
                "args": argparse.Namespace(model="SwiftFormer_XS", lr=1e-3)}, path)
    model = swift_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(UnsafePickleError) as e:
        load_checkpoint(model, path)
    one_line_error(e, "refusing to run code", f"(it calls {REFUSED[kind]})")
    assert not marker.exists()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # nothing half-loaded


def test_classes_named_by_the_file_are_never_imported(tmp_path, monkeypatch, swift_sd):
    """A class whose module would run code on import stays an inert placeholder."""
    marker = tmp_path / "IMPORTED"
    pkg_dir = tmp_path / "pkgs"
    pkg_dir.mkdir()
    (pkg_dir / "vitedge_evil_module.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "class Config:\n    def __setstate__(self, state):\n        open(state['path'], 'w').close()\n")
    monkeypatch.syspath_prepend(str(pkg_dir))
    import vitedge_evil_module

    cfg = vitedge_evil_module.Config()
    cfg.path = str(tmp_path / "SETSTATE")
    path = tmp_path / "ckpt.pth"
    torch.save({"model": swift_sd, "config": cfg}, path)
    marker.unlink()
    monkeypatch.delitem(sys.modules, "vitedge_evil_module")

    result = load_checkpoint(swift_model(), path)
    assert result.placeholders == ["vitedge_evil_module.Config"]
    assert result.metadata["config"] == {"path": str(tmp_path / "SETSTATE")}
    assert "vitedge_evil_module" not in sys.modules
    assert not marker.exists() and not (tmp_path / "SETSTATE").exists()


def test_state_cannot_be_set_on_live_objects(tmp_path):
    """BUILD on anything but a placeholder or a state_dict is refused (here: `__defaults__` of a rebuild shim)."""
    from vitedge.models.checkpoints import safe_pickle

    name = b"__defaults__"
    data = (b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n"  # the allow-listed shim itself
            b"N}(X" + struct.pack("<I", len(name)) + name + b"K\x07\x85u\x86b.")  # BUILD (None, {name: (7,)})
    path = tmp_path / "poke.pth"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", data)
    defaults = safe_pickle._rebuild_tensor_v2.__defaults__
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(swift_model(), path)
    one_line_error(e, "is corrupt or truncated", "state set on a function")
    assert safe_pickle._rebuild_tensor_v2.__defaults__ == defaults


# ------------------------------------------------------------------------------------------------
# Broken files: one line each, naming the problem
# ------------------------------------------------------------------------------------------------
@pytest.fixture
def good_file(swift_sd, tmp_path) -> Path:
    path = tmp_path / "good.pth"
    torch.save({"model": swift_sd, "epoch": 3}, path)
    return path


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(swift_model(), tmp_path / "nope.pth")
    one_line_error(e, "nope.pth not found")


def test_directory(tmp_path):
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(swift_model(), tmp_path)
    one_line_error(e, "is a directory, not a checkpoint file")


def test_empty_file(tmp_path):
    path = tmp_path / "empty.pth"
    path.touch()
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(swift_model(), path)
    one_line_error(e, "is empty (0 bytes)")


@pytest.mark.parametrize("keep", [0.5, 0.98])
def test_truncated_archive(good_file, keep):
    data = good_file.read_bytes()
    good_file.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(swift_model(), good_file)
    one_line_error(e, "truncated or corrupt zip archive")


def test_truncated_legacy_file(swift_sd, tmp_path):
    path = tmp_path / "legacy.pth"
    torch.save({"model": swift_sd}, path, _use_new_zipfile_serialization=False)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(swift_model(), path)
    one_line_error(e, "is corrupt or truncated", "truncated")


def test_corrupt_tensor_bytes_fail_the_crc(good_file):
    with zipfile.ZipFile(good_file) as zf:
        info = max(zf.infolist(), key=lambda i: i.file_size)  # the largest tensor record
    data = bytearray(good_file.read_bytes())
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26: info.header_offset + 30])
    start = info.header_offset + 30 + name_len + extra_len  # the record's first byte
    data[start + info.file_size // 2] ^= 0xFF
    good_file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(swift_model(), good_file)
    one_line_error(e, "is corrupt", "CRC")


def test_zip_bomb_record_is_refused_before_inflating(tmp_path):
    path = tmp_path / "bomb.pth"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf, zf.open("archive/data.pkl", "w") as f:
        for _ in range(64):
            f.write(bytes(1 << 20))  # 64 MiB of zeros, about 64 KiB compressed
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(swift_model(), path)
    one_line_error(e, "is corrupt or truncated", "record archive/data.pkl expands 67108864 bytes")


def test_corrupt_pickle_stream(swift_sd, tmp_path):
    path = tmp_path / "bad_pickle.pth"
    with zipfile.ZipFile(path, "w") as zf:  # a well-formed archive around a garbage data.pkl
        zf.writestr("archive/data.pkl", b"\x80\x02}q\x00(X\x05\x00\x00\x00modelq\x01\xff\xfe")
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(swift_model(), path)
    one_line_error(e, "is corrupt or truncated", "invalid pickle data")


@pytest.mark.parametrize("content,expect", [
    (b"hello, this is a text file\n" * 10, "is not a checkpoint"),
    (pickle.dumps({"model": {"w": [1.0, 2.0]}}, protocol=2), "not a torch.save checkpoint"),
], ids=["text", "plain-pickle"])
def test_not_a_checkpoint(content, expect, tmp_path):
    path = tmp_path / "thing.pth"
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(swift_model(), path)
    one_line_error(e, expect)


def test_other_archives_are_named(tmp_path):
    plain_zip = tmp_path / "plain.zip"
    with zipfile.ZipFile(plain_zip, "w") as zf:
        zf.writestr("readme.txt", "hi")
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(swift_model(), plain_zip)
    one_line_error(e, "zip archive without data.pkl")

    scripted = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), scripted)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(swift_model(), scripted)
    one_line_error(e, "TorchScript archive")

    old_tar = tmp_path / "old.pth"
    with tarfile.open(old_tar, "w") as tf:
        tf.add(plain_zip, arcname="storages")
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(swift_model(), old_tar)
    one_line_error(e, "torch < 0.4 tar checkpoint")


def test_pickle_protocol_0_is_named_unsupported(swift_sd, tmp_path):
    path = tmp_path / "p0.pth"
    torch.save({"model": swift_sd}, path, pickle_protocol=0)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(swift_model(), path)
    one_line_error(e, "saved with pickle protocol 0, which is not supported")


def test_corrupt_safetensors(swift_sd, tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "model.safetensors"
    save_file(swift_sd, str(path))
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(swift_model(), path)
    one_line_error(e, "corrupt or truncated safetensors")


def test_no_state_dict_in_container(tmp_path):
    path = tmp_path / "opt_only.pth"
    torch.save({"optimizer": {"state": {}}, "epoch": 5}, path)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(swift_model(), path)
    one_line_error(e, "no state_dict found in the container (keys: optimizer, epoch)")


def test_pickled_module_instead_of_state_dict(tmp_path):
    path = tmp_path / "whole_model.pth"
    torch.save(torch.nn.Linear(4, 2), path)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(swift_model(), path)
    one_line_error(e, "pickled nn.Module (torch.nn.modules.linear.Linear)", "model.state_dict()")


def test_wrong_family_names_the_family(tmp_path):
    sd = make_trained_like(create_model("slab_deit_tiny", **SLAB_MINI), seed=1).state_dict()
    path = tmp_path / "slab.pth"
    torch.save({"model": sd}, path)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(swift_model(), path)
    one_line_error(e, "does not fit swiftformer_xs", "missing", "unexpected", "looks like a slab model")


def test_wrong_family_full_size_names_the_variant():
    from vitedge.models.flops import meta_model

    with pytest.raises(CheckpointError) as e:
        load_checkpoint(meta_model("swiftformer_xs"), {"model": meta_model("sima_nano_12_p16").state_dict()})
    one_line_error(e, "the checkpoint fits sima_nano_12_p16")


def test_shape_mismatch(swift_sd, tmp_path):
    path = tmp_path / "wide.pth"
    wide = create_model("swiftformer_xs", layers=[1, 1, 2, 1], embed_dims=[16, 24, 32, 64], num_classes=10)
    torch.save({"model": wide.state_dict()}, path)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(swift_model(), path)
    # the model's own key names with other shapes: the tensors are named, no "closest" relative is guessed
    one_line_error(e, "shape mismatches (network.5.proj.weight: checkpoint [64, 32, 3, 3] vs model [48, 32, 3, 3]",
                   "has this model's layout but", "(`--set KEY=VALUE`)")
    assert "closest" not in str(e.value)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_nan_inf_weights(bad, dtype, swift_sd, tmp_path):
    sd = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in swift_sd.items()}
    sd["network.4.1.attn.to_key.weight"] = sd["network.4.1.attn.to_key.weight"].clone()
    sd["network.4.1.attn.to_key.weight"][3, 5] = bad
    sd["head.bias"] = sd["head.bias"].clone().fill_(bad)  # a later key: the first offender is named
    path = tmp_path / "diverged.pth"
    torch.save({"model": sd}, path)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(swift_model(), path, strict=False)
    one_line_error(e, "weight 'network.4.1.attn.to_key.weight' has 1 NaN/Inf value(s)")
