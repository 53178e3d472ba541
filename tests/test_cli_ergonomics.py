"""The command line's ergonomics (issue 20): -q anywhere, `models --json` / `--family`, `parity` without --model,
exit 3 for internal errors (an injected fault: one line, the traceback saved to a file), and `--config FILE`
(precedence: the command line wins; unknown keys and bad values exit 2 naming the key).

Most cases run `vitedge.cli.main` in-process (the same code path); the placements argparse used to refuse and the
exit-3 path also run as real processes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import vitedge
from vitedge import cli
from vitedge.models import catalog

REPO = Path(__file__).resolve().parents[1]
TINY = ["--model", "swiftformer_xs", "--set", "layers=[1,1,1,1]", "--set", "embed_dims=[8,8,16,16]",
        "--set", "num_classes=10", "--imgsz", "32"]


def _run(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "cli.py", *args], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def _parse(argv: list[str]):
    parser = cli.build_parser()
    cli.apply_config(parser, argv)
    return parser.parse_args(argv)


# ---- -q anywhere, models --json ---------------------------------------------------------------------

def test_quiet_before_or_after_the_command():
    for argv in (["-q", "export", *TINY], ["export", "-q", *TINY], ["export", *TINY, "--quiet"]):
        assert _parse(argv).quiet is True, argv
    assert _parse(["export", *TINY]).quiet is False
    # a real process, with -q after the command (a usage error before issue 20) and models --json
    r = _run("models", "--json", "--family", "sima_deit", "-q")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == vitedge.models(family="sima_deit")


def test_models_json_rows_are_the_api_rows(monkeypatch, capsys):
    names = ["sima_nano_12_p16", "slab_deit_tiny", "swiftformer_xs"]  # a subset keeps this fast (test_catalog: all)
    monkeypatch.setattr(catalog, "list_models", lambda family=None: names)
    assert cli.main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows == vitedge.models() == catalog.model_table(names)
    assert set(rows[0]) == {"name", "family", "params", "gmacs", "default_imgsz", "accepted_sizes"}
    assert cli.main(["models", "--family", "slab", "--json"]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)] == ["slab_deit_tiny"]
    assert cli.main(["models", "--family", "vit"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"unknown family 'vit'; choose one of {', '.join(catalog.families())}" in err[0]


# ---- parity without --model ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("ergo") / "xs"
    assert cli.main(["export", *TINY, "--samples", "2", "--out", str(out), "-q"]) == 0
    return out / "swiftformer_xs.onnx"


def test_parity_takes_the_model_from_the_artifact(exported, tmp_path, capsys):
    report = tmp_path / "p.json"
    assert cli.main(["parity", "--artifact", str(exported), "--samples", "2", "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("swiftformer_xs  imgsz 32") and "PASSED" in out
    d = json.loads(report.read_text())
    assert d["model"] == "swiftformer_xs" and d["overrides"]["embed_dims"] == [8, 8, 16, 16]
    assert d["exporter"] == "torchscript" and [h["status"] for h in d["parity"]] == ["passed", "passed"]
    # a different --model is still an error, and so is an artifact that does not say what it is
    assert cli.main(["parity", "--model", "sima_nano_12_p16", "--artifact", str(exported)]) == 2
    assert "pass --model swiftformer_xs" in capsys.readouterr().err
    plain = tmp_path / "plain.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation notice is not what is checked here
        torch.onnx.export(nn.Sequential(nn.Flatten(), nn.Linear(12, 2)).eval(), (torch.zeros(1, 3, 2, 2),),
                          str(plain), dynamo=False)
    assert cli.main(["parity", "--artifact", str(plain)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "carries no vitedge metadata naming its model; pass --model NAME" in err[0]


# ---- exit 3 --------------------------------------------------------------------------------------------

def test_an_internal_error_exits_3_with_its_traceback_saved(tmp_path, monkeypatch, capsys):
    def broken(family=None):
        raise ZeroDivisionError("planted internal fault")

    assert cli.main(["models", "--family", "nope"]) == 2  # bad input stays 2 (a failed hop stays 1): bugs are 3
    capsys.readouterr()
    monkeypatch.setattr(catalog, "models", broken)
    monkeypatch.setenv(cli.CRASH_DIR_ENV, str(tmp_path))
    assert cli.main(["models"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vitedge: internal error: ZeroDivisionError: planted internal fault;")
    assert "please report it" in err[0]
    saved = list(tmp_path.glob("vitedge-crash-*.txt"))
    assert len(saved) == 1 and str(saved[0]) in err[0]
    text = saved[0].read_text()
    assert "command: vitedge models" in text and "Traceback" in text and "planted internal fault" in text
    assert "in broken" in text  # the frame that raised
    monkeypatch.setenv("VITEDGE_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        cli.main(["models"])


def test_exit_3_from_a_real_process(tmp_path):
    code = ("import sys; from vitedge import cli; from vitedge.models import catalog\n"
            "def boom(family=None): raise KeyError('planted')\n"
            "catalog.models = boom\n"
            "sys.exit(cli.main(['models', '--json']))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, cli.CRASH_DIR_ENV: str(tmp_path)})
    assert r.returncode == 3 and r.stdout == "", r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "internal error: KeyError" in r.stderr
    assert len(list(tmp_path.glob("vitedge-crash-*.txt"))) == 1


# ---- --config FILE --------------------------------------------------------------------------------------

def test_config_gives_options_and_the_command_line_wins(tmp_path):
    cfg = tmp_path / "xs.yaml"
    cfg.write_text("model: swiftformer_xs\nimgsz: 64\nsamples: 8\ntargets: [onnx, coreml]\n"
                   "set: {layers: [1, 1, 1, 1], embed_dims: [8, 8, 16, 16]}\n"
                   "tol: [fp32.max_rel=2e-4]\nattn-order: kv_first\nrequire_verified: true\nexporter: dynamo\n"
                   "ios: 17\nrewrites: none\n")
    a = _parse(["export", "--config", str(cfg)])
    assert (a.model, a.imgsz, a.samples, a.target, a.attn_order, a.require_verified, a.exporter, a.ios, a.rewrites) \
        == ("swiftformer_xs", ((64, 64),), 8, "onnx,coreml", "kv_first", True, "dynamo", 17, False)
    assert dict(a.overrides) == {"layers": [1, 1, 1, 1], "embed_dims": [8, 8, 16, 16]} and a.tol == ["fp32.max_rel=2e-4"]
    # flags given on the command line win, before or after --config; repeatable flags add to the file's items
    b = _parse(["--config", str(cfg), "export", "--imgsz", "32", "--exporter", "torchscript", "--set",
                "embed_dims=[16,16,32,32]", "--tol", "fp32.max_rel=1e-3", "--target", "onnx"])
    assert (b.imgsz, b.exporter, b.target, b.samples) == (((32, 32),), "torchscript", "onnx", 8)
    assert dict(b.overrides)["embed_dims"] == [16, 16, 32, 32] and b.tol == ["fp32.max_rel=2e-4", "fp32.max_rel=1e-3"]
    # the same keys from TOML and JSON; a bench's comma lists as YAML lists
    (tmp_path / "b.toml").write_text('model = "swiftformer_xs"\nimgsz = [224, 256]\nbackends = ["torch"]\n')
    c = _parse(["bench", "--config", str(tmp_path / "b.toml")])
    assert (c.imgsz, c.backends) == (((224, 224), (256, 256)), "torch")
    (tmp_path / "m.json").write_text('{"ray": true, "workers": 2}')
    d = _parse(["matrix", "plan.yaml", "--out", "o", "--config", str(tmp_path / "m.json")])
    assert (d.ray, d.workers) == (True, 2)


def test_a_config_runs_an_export_end_to_end(tmp_path, capsys):
    cfg = tmp_path / "run.yaml"
    out = tmp_path / "out"
    cfg.write_text(f"model: swiftformer_xs\nset: {{layers: [1,1,1,1], embed_dims: [8,8,16,16], num_classes: 10}}\n"
                   f"imgsz: 64\nsamples: 2\nout: {out}\nquiet: true\n")
    assert cli.main(["export", "--config", str(cfg), "--imgsz", "32"]) == 0  # --model comes from the file
    report = json.loads((out / "report.json").read_text())
    assert report["imgsz"] == 32 and report["overrides"]["num_classes"] == 10 and report["samples"] == 2


@pytest.mark.parametrize("text,expect", [
    ("modle: swiftformer_xs\n", ["unknown key 'modle'", "did you mean 'model'", "vitedge export"]),
    ("model: swiftformer_xs\nimgsz: zero\n", ["imgsz", "positive integer", "'zero'"]),
    ("model: swiftformer_xs\nprecision: int4\n", ["precision", "'int4'", "fp32, fp16"]),
    ("model: swiftformer_xs\nforce: maybe\n", ["force", "true or false"]),
    ("model: swiftformer_xs\nimgsz: true\n", ["imgsz", "takes a value"]),
    ("- model\n", ["must be a mapping"]),
    ("model: [unclosed\n", ["does not parse"]),
])
def test_bad_config_exits_2_naming_the_key(tmp_path, capsys, text, expect):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    out = tmp_path / "never"
    assert cli.main(["export", "--config", str(cfg), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"vitedge: error: --config {cfg}"), err
    for e in expect:
        assert e in err[0], (e, err[0])
    assert not out.exists()


def test_missing_config_file_exits_2(tmp_path, capsys):
    assert cli.main(["models", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read it" in capsys.readouterr().err


def test_onnx_runtime_logs_nothing_onto_stderr_during_an_int8_export(tmp_path):
    """The quantizer's calibration sessions used to print ONNX Runtime's colour-coded warnings; with -q stderr
    stays empty."""
    cli = Path(__file__).resolve().parents[1] / "cli.py"
    r = subprocess.run([sys.executable, str(cli), "-q", "export", "--model", "swiftformer_xs", "--set",
                        "layers=[1,1,1,1]", "--set", "embed_dims=[8,8,16,16]", "--set", "num_classes=5", "--imgsz",
                        "32", "--samples", "4", "--precision", "int8", "--calib", "4", "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr == "", r.stderr[-2000:]


def _interrupted_import(name):
    """builtins.__import__ that fails `name` as a Ctrl-C landing inside a C extension's import does: an ImportError
    ("initialization failed") whose cause is the KeyboardInterrupt."""
    import builtins

    real = builtins.__import__

    def fake(mod, *a, **k):
        if mod == name or mod.startswith(name + "."):
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt as ki:
                raise ImportError("initialization failed") from ki
        return real(mod, *a, **k)
    return fake


def test_a_ctrl_c_inside_a_backend_import_exits_130_never_not_installed(tmp_path, capsys, monkeypatch):
    import builtins

    from vitedge.cli import main
    from vitedge.targets.onnx.target import OnnxTarget

    monkeypatch.setattr(builtins, "__import__", _interrupted_import("onnxruntime"))
    with pytest.raises(KeyboardInterrupt):  # the target's probe: an interrupt, not "onnxruntime is not installed"
        OnnxTarget().available()
    out = tmp_path / "run"
    rc = main(["-q", "export", "--model", "swiftformer_xs", "--set", "layers=[1,1,1,1]", "--set",
               "embed_dims=[8,8,16,16]", "--set", "num_classes=5", "--imgsz", "32", "--samples", "2", "--out",
               str(out)])
    err = capsys.readouterr().err
    assert rc == 130 and "interrupted" in err and "not installed" not in err, err
    assert not out.exists()
