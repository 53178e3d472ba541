"""`hf-hub:` and `timm:` checkpoint sources, resolved offline (HF_HUB_OFFLINE=1) against a local cache laid out
as huggingface_hub lays out its own (models--ORG--REPO/{blobs,snapshots/<commit>,refs/<revision>}; checked with
huggingface_hub's `scan_cache_dir`), then loaded through the same safe loader as a local file."""
from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save as safetensors_bytes

from vitedge.models import create_model, make_trained_like
from vitedge.models.checkpoints import load_checkpoint
from vitedge.errors import CheckpointError
from vitedge.models.checkpoints.hub_sources import DEFAULT_FILES, TIMM_WEIGHTS, parse_source, resolve_checkpoint
from vitedge.models.reduced import reduced
from vitedge.tests._ci import require
from vitedge.tests._timm import import_timm

hub = require("huggingface_hub", "the [hub] extra (huggingface_hub) is needed for hub sources", module_level=True)
from huggingface_hub.file_download import repo_folder_name  # noqa: E402

TINY = reduced("swiftformer")


def put_in_cache(cache: Path, repo_id: str, filename: str, data: bytes, revision: str = "main") -> Path:
    """Store `data` as huggingface_hub does after a download: the content in blobs/<sha256>, a relative symlink
    snapshots/<commit>/<filename> -> ../../blobs/<sha256>, and refs/<revision> holding the commit hash."""
    repo = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    commit = hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()
    link = repo / "snapshots" / commit / filename
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    return link


def _pth(sd) -> bytes:
    buf = io.BytesIO()
    torch.save(sd, buf)
    return buf.getvalue()


def _mini(seed: int | None):
    m = create_model("swiftformer_xs", **TINY)
    return (make_trained_like(m, seed) if seed is not None else m).eval()


def _same(model, sd) -> bool:
    return all(torch.equal(v, sd[k]) for k, v in model.state_dict().items())


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "hf-cache"
    folder.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    return folder


def test_hf_hub_file_resolves_offline_and_loads_through_the_safe_loader(cache):
    src = _mini(seed=1)
    put_in_cache(cache, "acme/swift-mini", "weights.pth", _pth({"model": src.state_dict(), "epoch": 3}))
    info = hub.scan_cache_dir(cache)  # huggingface_hub reads the layout as its own
    assert {(r.repo_id, f.file_name) for r in info.repos for rev in r.revisions for f in rev.files} == \
        {("acme/swift-mini", "weights.pth")}
    dst = _mini(seed=None)
    result = load_checkpoint(dst, "hf-hub:acme/swift-mini:weights.pth")
    assert _same(dst, src.state_dict())
    assert (result.path, result.format, result.source_key) == ("hf-hub:acme/swift-mini:weights.pth", "torch-zip",
                                                               "model")
    assert result.metadata["epoch"] == 3
    path = resolve_checkpoint("hf-hub:acme/swift-mini:weights.pth")
    assert path.is_file() and cache in path.parents


def test_without_a_file_name_safetensors_comes_first_then_pytorch_model_bin(cache):
    a, b = _mini(seed=2), _mini(seed=3)
    put_in_cache(cache, "acme/both", "model.safetensors", safetensors_bytes(a.state_dict()))
    put_in_cache(cache, "acme/both", "pytorch_model.bin", _pth(b.state_dict()))
    put_in_cache(cache, "acme/bin-only", "pytorch_model.bin", _pth(b.state_dict()))
    dst = _mini(seed=None)
    assert load_checkpoint(dst, "hf-hub:acme/both").format == "safetensors" and _same(dst, a.state_dict())
    assert load_checkpoint(dst, "hf-hub:acme/bin-only").format == "torch-zip" and _same(dst, b.state_dict())
    assert parse_source("hf-hub:acme/both").files == DEFAULT_FILES == ("model.safetensors", "pytorch_model.bin",
                                                                       "pytorch_model.pth")


def test_the_command_line_takes_a_hub_checkpoint_and_records_the_files_sha256(cache, tmp_path, capsys):
    from vitedge import cli
    from vitedge.exporter.flow.deploy_checkpoint import read_deploy_checkpoint

    data = _pth(_mini(seed=7).state_dict())
    put_in_cache(cache, "acme/swift-mini", "weights.pth", data)
    out = tmp_path / "deploy.pth"
    code = cli.main(["reparam", "--model", "swiftformer_xs", "--set", "layers=[1,1,2,1]", "--set",
                     "embed_dims=[16,24,32,48]", "--set", "num_classes=10", "--imgsz", "64",
                     "--checkpoint", "hf-hub:acme/swift-mini:weights.pth", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    assert read_deploy_checkpoint(out)["checkpoint_sha256"] == hashlib.sha256(data).hexdigest()
    code = cli.main(["reparam", "--model", "swiftformer_xs", "--checkpoint", "hf-hub:acme/absent", "--out",
                     str(tmp_path / "never.pth")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("vitedge: error: --checkpoint hf-hub:acme/absent: model.safetensors")
    assert not (tmp_path / "never.pth").exists()


def test_a_revision_selects_its_own_snapshot(cache):
    main, v1 = _mini(seed=4), _mini(seed=5)
    put_in_cache(cache, "acme/rev", "w.pth", _pth(main.state_dict()))
    put_in_cache(cache, "acme/rev", "w.pth", _pth(v1.state_dict()), revision="v1")
    dst = _mini(seed=None)
    load_checkpoint(dst, "hf-hub:acme/rev@v1:w.pth")
    assert _same(dst, v1.state_dict())
    load_checkpoint(dst, "hf-hub:acme/rev:w.pth")
    assert _same(dst, main.state_dict())


def test_offline_without_the_file_is_one_line_naming_the_repo_file_and_how_to_fetch_it(cache):
    put_in_cache(cache, "acme/swift-mini", "weights.pth", _pth(_mini(seed=1).state_dict()))
    for spec, missing, repo in (("hf-hub:acme/swift-mini:other.pth", "other.pth", "acme/swift-mini"),
                                ("hf-hub:acme/absent", "model.safetensors", "acme/absent")):
        with pytest.raises(CheckpointError) as e:
            load_checkpoint(_mini(seed=None), spec)
        msg = str(e.value)
        assert "\n" not in msg and f"{missing}" in msg and f"of {repo} is not in the Hugging Face cache" in msg
        assert "HF_HUB_OFFLINE=1" in msg and f"`hf download {repo} {missing}`" in msg and str(cache) in msg


def test_malformed_or_unsupported_sources_are_bad_input():
    for spec in ("hf-hub:no-slash", "hf-hub:a/b:../escape.pth", "hf-hub:/abs/x"):
        with pytest.raises(CheckpointError, match="hf-hub:ORG/REPO"):
            parse_source(spec)
    with pytest.raises(CheckpointError, match="swiftformer_xs, swiftformer_s, swiftformer_l1, swiftformer_l3"):
        parse_source("timm:slab_deit_tiny")
    assert resolve_checkpoint("local/hf-hub:x.pth") == "local/hf-hub:x.pth"  # only a leading prefix is a source
    assert parse_source("timm:swiftformer_l1.other_tag").repo_id == "timm/swiftformer_l1.other_tag"


def test_without_huggingface_hub_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails as if not installed
    with pytest.raises(CheckpointError, match=r"needs huggingface_hub: pip install 'vitedge\[hub\]'"):
        resolve_checkpoint("hf-hub:acme/x:w.pth")


def test_timm_name_loads_timms_own_state_dict_from_its_hub_repo(cache):
    timm = import_timm()
    from timm.models.swiftformer import SwiftFormer

    ref = make_trained_like(SwiftFormer(layers=TINY["layers"], embed_dims=TINY["embed_dims"], num_classes=10),
                            seed=6).eval()
    repo = "timm/swiftformer_xs." + TIMM_WEIGHTS["swiftformer_xs"][0]
    assert timm.models.get_pretrained_cfg("swiftformer_xs").hf_hub_id == repo  # timm's own naming
    put_in_cache(cache, repo, "model.safetensors", safetensors_bytes(ref.state_dict()))
    dst = _mini(seed=None)
    result = load_checkpoint(dst, "timm:swiftformer_xs")
    assert result.remaps and result.remaps[-1].startswith("timm SwiftFormer key names -> official")
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert float((dst(x) - ref(x)).abs().max()) <= 1e-5
    with pytest.raises(CheckpointError, match="holds swiftformer_xs weights, not swiftformer_s's: use --model "
                                              "swiftformer_xs"):
        load_checkpoint(create_model("swiftformer_s"), "timm:swiftformer_xs")


def test_timm_resolution_needs_no_timm_and_reads_the_environment_of_a_fresh_process(tmp_path):
    cache = tmp_path / "fresh-cache"
    link = put_in_cache(cache, "timm/swiftformer_s.dist_in1k", "pytorch_model.bin", b"not read here")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache))
    code = ("import sys; from vitedge.models.checkpoints.hub_sources import resolve_checkpoint; "
            "print(resolve_checkpoint('timm:swiftformer_s')); print('timm' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    path, imported = proc.stdout.split()
    assert Path(path) == link and imported == "False"


def test_an_unreachable_hub_fails_fast_and_says_so(cache, monkeypatch):
    """No network (a closed port here): one connection attempt, then the cache only, within seconds; the message
    says the hub is unreachable and names HF_HUB_OFFLINE=1 only as the way to skip the attempt."""
    import time

    monkeypatch.delenv("HF_HUB_OFFLINE")
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)  # (through a proxy the probe leaves it to huggingface_hub)
    t0 = time.perf_counter()
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(_mini(seed=None), "hf-hub:acme/absent")
    msg = str(e.value)
    assert time.perf_counter() - t0 < 10
    assert "unreachable (one connection to 127.0.0.1:9 failed" in msg and "unset HF_HUB_OFFLINE" not in msg
    assert "set HF_HUB_OFFLINE=1 to skip the connection attempt" in msg
