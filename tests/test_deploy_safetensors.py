"""Deploy-form checkpoints as safetensors (`vitedge reparam --out X.safetensors`): the metadata as string fields,
a round trip that computes what a fresh fold computes, strict loading, and a planted corrupted tensor failing
the deploy-form hop with the module named, as with `.pth`."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from vitedge import cli
from vitedge.exporter.reparam import build_forms
from vitedge.exporter.flow.deploy_checkpoint import FORMAT, load_deploy_checkpoint, reparam_checkpoint
from vitedge.exporter.verdict.hops import parity_set_for
from vitedge.exporter.flow.verify import parity
from vitedge.errors import CheckpointError
from vitedge.models.reduced import reduced

SWIFT = reduced("swiftformer")
IMGSZ = 64
KEY = "network.4.1.linear.fc1.weight"  # a stage-4 MLP weight (the module test_cli corrupts in .pth files)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("st")
    st = reparam_checkpoint("swiftformer_xs", tmp / "d.safetensors", imgsz=IMGSZ, overrides=SWIFT)
    pth = reparam_checkpoint("swiftformer_xs", tmp / "d.pth", imgsz=IMGSZ, overrides=SWIFT)
    return tmp, st, pth


def _contents(path):
    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}


def test_safetensors_holds_the_state_dict_and_string_metadata(written):
    _, st, pth = written
    assert st.path.suffix == ".safetensors" and st.path.read_bytes()[8:9] == b"{"  # a safetensors header
    meta, tensors = _contents(st.path)
    assert all(isinstance(v, str) for v in meta.values())
    assert (meta["format"], meta["model"], meta["attn_order"]) == (FORMAT, "swiftformer_xs", "auto")
    assert "checkpoint_sha256" not in meta  # untrained demo weights: no checkpoint
    assert json.loads(meta["imgsz"]) == IMGSZ and json.loads(meta["overrides"]) == SWIFT
    assert json.loads(meta["rewrites"]) == list(st.summary.rewrites) and json.loads(meta["rewrites"])
    assert json.loads(meta["reparam"])["folded"] == st.summary.to_dict()["folded"]
    assert json.loads(meta["versions"])["torch"] == torch.__version__
    # the same tensors as the .pth deploy checkpoint of the same fold
    reference = torch.load(pth.path, weights_only=True)["state_dict"]
    assert tensors.keys() == reference.keys() and all(torch.equal(tensors[k], reference[k]) for k in tensors)


def test_round_trip_computes_what_a_fresh_fold_computes(written):
    _, st, _ = written
    loaded = load_deploy_checkpoint(st.path)
    assert loaded.deploy_checkpoint_meta["model"] == "swiftformer_xs"
    assert loaded.deploy_checkpoint_meta["checkpoint_sha256"] is None
    train = build_forms.build_train_form("swiftformer_xs", overrides=SWIFT).model
    fresh, _ = build_forms.build_deploy_form(train, IMGSZ)
    x = torch.from_numpy(parity_set_for(train, 3, IMGSZ))
    with torch.no_grad():
        assert torch.equal(loaded(x), fresh(x))


def test_loading_is_strict_and_refuses_files_that_are_not_deploy_checkpoints(written):
    tmp, st, _ = written
    meta, tensors = _contents(st.path)
    extra = dict(tensors, **{"network.4.1.extra": torch.zeros(2)})
    save_file(extra, str(tmp / "extra.safetensors"), metadata=meta)
    with pytest.raises(CheckpointError, match=r"does not fit swiftformer_xs's deploy-form: 0 missing .*1 unexpected"):
        load_deploy_checkpoint(tmp / "extra.safetensors")
    missing = {k: v for k, v in tensors.items() if k != KEY}
    save_file(missing, str(tmp / "missing.safetensors"), metadata=meta)
    with pytest.raises(CheckpointError, match=f"1 missing .*{KEY}"):
        load_deploy_checkpoint(tmp / "missing.safetensors")
    save_file(tensors, str(tmp / "bare.safetensors"))  # weights without the deploy metadata
    with pytest.raises(CheckpointError, match="not a vitedge deploy checkpoint"):
        load_deploy_checkpoint(tmp / "bare.safetensors")
    (tmp / "junk.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(CheckpointError, match="not a vitedge deploy checkpoint"):
        load_deploy_checkpoint(tmp / "junk.safetensors")


def test_a_corrupted_tensor_fails_the_deploy_form_hop_and_names_the_module(written):
    tmp, st, _ = written
    meta, tensors = _contents(st.path)
    tensors[KEY] = tensors[KEY] * 1.5
    save_file(tensors, str(tmp / "bad.safetensors"), metadata=meta)
    report = parity("swiftformer_xs", deploy_checkpoint=tmp / "bad.safetensors", imgsz=IMGSZ,
                             overrides=SWIFT, samples=4)
    hop = report.hop("deploy-form")
    assert report.exit_code == 1 and hop.status == "failed" and hop.diverging_module == KEY.rpartition(".")[0]
    healthy = parity("swiftformer_xs", deploy_checkpoint=st.path, imgsz=IMGSZ, overrides=SWIFT, samples=4)
    assert healthy.exit_code == 0 and healthy.hop("deploy-form").status == "passed"


def test_cli_reparam_writes_safetensors_by_the_suffix(tmp_path, capsys):
    out = tmp_path / "cli.safetensors"
    code = cli.main(["reparam", "--model", "swiftformer_xs", "--set", "layers=[1,1,2,1]", "--set",
                     "embed_dims=[16,24,32,48]", "--set", "num_classes=10", "--imgsz", str(IMGSZ), "--out", str(out)])
    assert code == 0 and f"wrote {out}" in capsys.readouterr().out
    assert _contents(out)[0]["format"] == FORMAT
    assert load_deploy_checkpoint(out).deploy_checkpoint_meta["imgsz"] == IMGSZ
