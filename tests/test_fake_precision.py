"""A new precision moves in through one room: its row of precisions.py, registered with `precisions.register`. A
fake precision declared in this file alone (an fp16-kind row with its own tolerance profile, K and weights-check K)
and a fake target that makes it get the CLI's `--precision` choice, `export` judged by the fake's own profile,
`parity --artifact` of its artifact, its weights check catching a planted channel, and `--tol` of its profile, with
no product file changed: every reader looks the table up when it runs, not at import.

The artifact is the pipeline's fp16 ONNX graph (the onnx target's own conversion) saved under the fake suffix and
run on ONNX Runtime (the fake compressed target's handling, tests/test_fake_compressed_target.py): a real fp16
artifact judged by the real ladder. Only the precision row is new here."""
from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from vitedge import cli, precisions
from vitedge.precisions import FP16_ERROR, HALF, HALF_ULP, Emulation, Precision, Profile, Rule
from vitedge.targets import TargetRow, register, unregister
from vitedge.targets.base import Artifact, LowerSpec
from vitedge.targets.graph.metadata import read_metadata, set_metadata
from vitedge.targets.graph.onnx_fp16 import convert_onnx_fp16
from vitedge.targets.graph.precision import default_policy
from vitedge.targets.plants import plant_fp16_initializer
from vitedge.tests.test_fake_compressed_target import FakeQTarget  # its artifact handling; the precision is ours

TINY = ["--model", "swiftformer_xs", "--set", "layers=[1,1,1,1]", "--set", "embed_dims=[8,8,16,16]",
        "--set", "num_classes=10", "--imgsz", "32"]
# Numbers of the fake's own, unlike every built-in profile's, so the report shows which row judged the hop: a K of
# 5 (fp16's is 4), a median bound of 2.5 (fp16's 2), a weights-check K of 3 (fp16's 4), a PSNR bound of 33 dB.
FAKE = Precision("fp16s", HALF, Profile("fp16s", Rule(FP16_ERROR, floor=HALF_ULP, k=5.0, median=2.5),
                                        dict(cosine=0.999, psnr_db=33.0, top1_agreement=0.99)),
                 weight_k=3.0, bits=16, emulation=Emulation("fp16"))


class HalfTarget(FakeQTarget):
    """The fake compressed target's artifact handling (save under its suffix, run on ONNX Runtime, read its own
    weights), lowering the base graph (fp32) or its fp16 conversion (the fake precision) as NAME[.fp16s].half."""

    def lower(self, deploy_model, spec: LowerSpec) -> Artifact:
        model = onnx.load(str(spec.onnx_path))
        if spec.precision != "fp32":
            model = convert_onnx_fp16(model, default_policy())
        set_metadata(model, {**read_metadata(onnx.load(str(spec.onnx_path))), **spec.metadata})
        stem = spec.name if spec.precision == "fp32" else f"{spec.name}.{spec.precision}"
        path = Path(spec.out_dir) / f"{stem}{self.suffix}"
        onnx.save(model, str(path))
        return Artifact(self.name, path, spec.precision)


@pytest.fixture(scope="module")
def fake_precision():
    precisions.register(FAKE)
    row = register(TargetRow("half", HalfTarget, suffixes=(".half",), precisions=("fp32", "fp16s"),
                             default_precision="fp16s", packages=("onnxruntime",)))
    yield FAKE
    unregister(row.name)
    precisions.unregister(FAKE.name)


@pytest.fixture(scope="module")
def exported(fake_precision, tmp_path_factory):
    out = tmp_path_factory.mktemp("fake_precision") / "run"
    rc = cli.main(["export", *TINY, "--target", "half", "--precision", "fp16s", "--samples", "16",
                   "--out", str(out), "-q"])
    return rc, out


def test_a_registered_precision_is_a_choice_and_judged_by_its_own_row(exported):
    rc, out = exported
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    hop = next(h for h in report["parity"] if h["hop"] == "half")
    assert hop["status"] == "passed", hop
    tol = hop["tolerance"]
    assert (tol["profile"], tol["fp16_k"], tol["fp16_median"], tol["psnr_db"]) == ("fp16s", 5.0, 2.5, 33.0)
    weights = hop["weights"]
    assert weights["status"] == "passed" and weights["checked"] >= 8, weights
    # a correct fp16 channel sits exactly at fp16's rounding, one allowance unit: its ratio is 1/K, the row's 3
    assert weights["worst"]["ratio"] == pytest.approx(1 / 3), weights


def test_parity_of_its_artifact_and_its_weights_check_catches_a_plant(exported, tmp_path):
    _, out = exported
    artifact = out / "swiftformer_xs.fp16s.half"
    assert cli.main(["parity", "--artifact", str(artifact), "--samples", "16", "--tol", "fp16s.psnr_db=20",
                     "--report", str(tmp_path / "p.json"), "-q"]) == 0   # its metadata names the precision
    hop = next(h for h in json.loads((tmp_path / "p.json").read_text())["parity"] if h["hop"] == "half")
    assert hop["status"] == "passed" and hop["tolerance"]["psnr_db"] == 20.0 and hop["weights"]["status"] == "passed"

    planted = tmp_path / "planted.fp16s.half"   # one mid-network output channel x1.1: far beyond fp16's rounding
    plant_fp16_initializer(artifact, planted, "x1.1", 0.5)
    assert cli.main(["parity", "--artifact", str(planted), "--samples", "16", "--report", str(tmp_path / "bad.json"),
                     "-q"]) == 1
    bad = next(h for h in json.loads((tmp_path / "bad.json").read_text())["parity"] if h["hop"] == "half")
    assert bad["status"] == "failed" and bad["weights"]["status"] == "failed", bad


def test_unregistered_it_is_refused_again(fake_precision, capsys):
    precisions.unregister(FAKE.name)
    try:
        with pytest.raises(SystemExit) as refused:   # argparse's refusal of a choice
            cli.main(["export", *TINY, "--target", "onnx", "--precision", "fp16s", "--out", "unused", "-q"])
        assert refused.value.code == 2
        assert "fp16s" in capsys.readouterr().err
    finally:
        precisions.register(FAKE)
    with pytest.raises(ValueError, match="built-in"):
        precisions.register(Precision("fp16", HALF, FAKE.profile))
