"""--imgsz S or HxW for every family: the size reaches the ONNX input, the report and the parity ladder; a size off
the family's stride is exit 2 naming the nearest valid sizes; each family's resampling or padding is compared with an
independent computation of the same convention (timm's `resample_abs_pos_embed` for the position tables)."""
from __future__ import annotations

import json

import onnx
import pytest
import torch

from vitedge import cli
from vitedge.exporter.flow.pipeline import export
from vitedge.models.input_size import nearest_sizes
from vitedge.models.reduced import REDUCED, case
from vitedge.models.registry import create_model, set_input_size
from vitedge.tests._timm import import_timm

# A non-square size every family takes (multiples of 32): the whole ladder runs there for every family, cheaply
# (the float64 reference of 256x320 costs 10-30 s per family on this machine; slab_deit also runs at 256x320).
WIDE = (64, 96)


def _export(tmp_path, family: str, size=WIDE):
    name, overrides, _ = case(family)
    out = tmp_path / family
    report = export(name, targets="onnx", imgsz=size, overrides=overrides, out=out, samples=8)
    return report, out, name


# What each family changes at 64x96 (reduced configs), first entry of report.json's `resized`.
FIRST_RESIZED = {"swiftformer": None, "slab_deit": "pos_embed", "prepbn_deit": "pos_embed", "sima_deit": "pos_embed",
                 "slab_swin": "layers.0.blocks.0", "prepbn_swin": "layers.0.blocks.0", "slab_pvt": "pos_embed1",
                 "prepbn_pvt": "pos_embed1", "slab_cswin": "stage1.0.attns.0.positional_encoding",
                 "sima": None}  # (the two-branch CSWin: test_cswin_sla_stripes_padded_pass_the_ladder)


@pytest.mark.parametrize("family", list(FIRST_RESIZED))
def test_a_non_square_size_runs_the_whole_ladder_and_is_recorded(tmp_path, family):
    report, out, name = _export(tmp_path, family)
    assert report.exit_code == 0 and [h.status for h in report.parity] == ["passed"] * 3
    assert report.reparam.equivalence["passed"]
    d = json.loads((out / "report.json").read_text())
    assert (d["imgsz"], d["input_size"]) == ("64x96", [64, 96])
    dims = [x.dim_value for x in onnx.load(str(out / f"{name}.onnx")).graph.input[0].type.tensor_type.shape.dim]
    assert dims[1:] == [3, 64, 96]
    assert (d["resized"][0]["tensor"] if d["resized"] else None) == FIRST_RESIZED[family]
    # every SLA / SimA block's order, recorded with its real token counts at 64x96, follows its family's rule
    blocks, reasons = d["reparam"]["attention_blocks"], d["reparam"]["attention_reason"]
    assert set(blocks) == {p for p, why in reasons.items() if not why.startswith("softmax")}
    for path, b in blocks.items():
        n, nk, dh = b["n"], b["n_kv"], b["d"]
        if b["rule"] == "sla":  # SLAB: K^T V first iff N N' (d + d) > d d (N + N')
            want = "kv_first" if n * nk * 2 * dh > dh * dh * (n + nk) else "qk_first"
        else:  # SimA: (Q K^T) V iff N < d
            want = "qk_first" if n < dh else "kv_first"
        assert b["order"] == want == d["reparam"]["attention_order"][path], (path, b)


def test_slab_deit_at_256x320(tmp_path):
    report, out, _ = _export(tmp_path, "slab_deit", "256x320")
    assert report.exit_code == 0 and report.input_size == [256, 320]
    assert {r["tensor"]: r["to"] for r in report.resized}["pos_embed"] == [320, 16, 20]


@pytest.mark.parametrize("family,size,n,order", [("slab_deit", 224, 196, "kv_first"),
                                                  ("slab_deit", WIDE, 24, "qk_first"),
                                                  ("sima", 224, 196, "kv_first"), ("sima", WIDE, 24, "qk_first")])
def test_the_order_is_decided_per_block_on_the_real_token_count(family, size, n, order):
    from vitedge.exporter.reparam import reparameterize
    from vitedge.models import make_trained_like

    name, overrides, _ = case(family)
    model = make_trained_like(create_model(name, **overrides)).eval()  # (its LN->RepBN schedules finished)
    summary = reparameterize(model, imgsz=size).reparam_summary
    blocks = summary.attention_blocks
    assert blocks and all(b["n"] == n and b["d"] == 32 and b["order"] == order for b in blocks.values()), blocks


@pytest.mark.parametrize("size,imgsz", [(224, 224), ((224, 224), 224), ((256, 320), "256x320")])
def test_report_imgsz_keeps_the_int_for_square_sizes(size, imgsz):
    from vitedge.exporter.core.report import Report, ReparamInfo

    d = Report(model="m", imgsz=size, batch=1, weights="untrained", checkpoint_sha256=None,
               reparam=ReparamInfo()).to_dict()
    assert (d["imgsz"], d["input_size"]) == (imgsz, list(size) if isinstance(size, tuple) else [size, size])
    assert Report.from_dict(json.loads(json.dumps(d))).imgsz == (size if size != (224, 224) else 224)


@pytest.mark.parametrize("size,stride,near", [("250x320", 16, ["256x320", "240x320"]), ("100", 32, ["96", "128"]),
                                              ("64x70", 32, ["64", "64x96"])])
def test_nearest_valid_sizes(size, stride, near):
    assert nearest_sizes(size, stride)[:2] == near


def test_a_size_off_the_stride_is_exit_2_naming_the_nearest_sizes(tmp_path, capsys):
    out = tmp_path / "out"
    name, _, _ = case("slab_deit")
    code = cli.main(["export", "--model", name, "--set", "embed_dim=64", "--set", "depth=1", "--set", "num_heads=2",
                     "--imgsz", "250x320", "--out", str(out), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "divisible by 16" in err and "256x320" in err and "240x320" in err
    assert not out.exists()


@pytest.mark.parametrize("family", ["slab_deit", "prepbn_deit", "sima_deit", "slab_pvt"])
def test_position_tables_match_timm_resample_abs_pos_embed(family):
    timm = import_timm()
    from timm.layers import resample_abs_pos_embed

    name, overrides, _ = case(family)
    model = create_model(name, **overrides).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    records = [r for r in set_input_size(model, (256, 320) if model.img_size >= 224 else (64, 96))
               if "bicubic" in r["how"]]
    assert records and timm is not None
    for r in records:
        prefix = r["from"][0] - r["from"][1] * r["from"][2]  # [prefix + h*w, h, w]
        want = resample_abs_pos_embed(before[r["tensor"]], new_size=r["to"][1:], old_size=r["from"][1:],
                                      num_prefix_tokens=prefix)
        torch.testing.assert_close(dict(model.named_parameters())[r["tensor"]], want, rtol=0, atol=0)
    # and back at its own size: the pretrained tables, not a resampling of a resampling
    set_input_size(model, model.img_size)
    for r in records:
        assert torch.equal(dict(model.named_parameters())[r["tensor"]], before[r["tensor"]])


def test_pvt_stage_position_embeddings_resize_as_the_official_get_pos_embed():
    import torch.nn.functional as F

    name, overrides, _ = case("prepbn_pvt")
    model = create_model(name, **overrides).eval()
    records = {r["tensor"]: r for r in set_input_size(model, (64, 96))}
    for i in range(4):
        pe, pos = getattr(model, f"patch_embed{i + 1}"), getattr(model, f"pos_embed{i + 1}")
        h, w = records[f"pos_embed{i + 1}"]["to"][1:]
        # PVT's _get_pos_embed (whai362/PVT classification/pvt.py), written out
        want = F.interpolate(pos.reshape(1, pe.H, pe.W, -1).permute(0, 3, 1, 2), size=(h, w),
                             mode="bilinear").reshape(1, -1, h * w).permute(0, 2, 1)
        torch.testing.assert_close(model.stage_pos_embed(i, (h, w)), want, rtol=0, atol=0)


# ---- Swin: the detection backbones' padding, written out as in swin_transformer_slab.py ---------------------------

def _official_block(blk, x, h, w):
    """SwinTransformerBlock.forward + BasicLayer's mask of SLAB's detection/mmdet_custom/swin_transformer_slab.py,
    written out: norm1, zero-pad bottom/right to window multiples, shift, partition, attention (the mask built for
    the padded map), reverse, unshift, crop, residual, MLP."""
    import torch.nn.functional as F

    ws, shift = blk.window_size, blk.shift_size
    b, _, c = x.shape
    y = blk.norm1(x).view(b, h, w, c)
    pad_r, pad_b = (ws - w % ws) % ws, (ws - h % ws) % ws
    y = F.pad(y, (0, 0, 0, pad_r, 0, pad_b))
    hp, wp = y.shape[1:3]

    def partition(t):
        t = t.view(t.shape[0], hp // ws, ws, wp // ws, ws, t.shape[-1])
        return t.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, ws * ws, t.shape[-1])

    mask = None
    if shift:
        img = torch.zeros(1, hp, wp, 1)
        cnt = 0
        for hs in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
            for wsl in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
                img[:, hs, wsl, :] = cnt
                cnt += 1
        mw = partition(img).squeeze(-1)
        mask = (mw.unsqueeze(1) - mw.unsqueeze(2))
        mask = mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)
        y = torch.roll(y, shifts=(-shift, -shift), dims=(1, 2))
    win = partition(y)
    out = blk.attn(win, mask) if blk.attn_type == "S" else blk.attn(win, (ws, ws))
    out = out.view(-1, ws, ws, c).view(b, hp // ws, wp // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(b, hp, wp, c)
    if shift:
        out = torch.roll(out, shifts=(shift, shift), dims=(1, 2))
    out = out[:, :h, :w, :].reshape(b, h * w, c)
    x = x + out
    return x + blk.mlp(blk.norm2(x))


@pytest.mark.parametrize("family", ["slab_swin", "prepbn_swin"])
def test_swin_blocks_pad_as_the_official_detection_backbone(family):
    name, overrides, _ = case(family)
    model = create_model(name, **overrides).eval()
    records = set_input_size(model, (256, 320))
    padded = {r["tensor"] for r in records}
    torch.manual_seed(0)
    checked = 0
    for i, layer in enumerate(model.layers):
        h, w = 256 // 4 // 2 ** i, 320 // 4 // 2 ** i
        for j, blk in enumerate(layer.blocks):
            x = torch.randn(2, h * w, layer.dim)
            with torch.no_grad():
                torch.testing.assert_close(blk(x), _official_block(blk, x, h, w), rtol=1e-5, atol=1e-5)
            assert (f"layers.{i}.blocks.{j}" in padded) == bool(h % blk.window_size or w % blk.window_size)
            checked += 1
    # the SLA stages keep their pretraining windows (56, 28) and the shifted softmax blocks are masked
    assert [blk.window_size for blk in model.layers[0].blocks] == ([56] if family == "slab_swin" else [7, 7])
    assert checked == sum(len(layer.blocks) for layer in model.layers)


# ---- CSWin: the official segmentation backbone's stripes and padding, written out ---------------------------------

def _official_lepe_forward(br, q, k, v, h, w):
    """LePEAttention.forward of microsoft/CSWin-Transformer segmentation/backbone/cswin_transformer.py, written out
    on (B, C, H, W) maps: the window by idx at this size, centred zero padding, windows, softmax + LePE (get_v per
    window), back to the map, crop."""
    import torch.nn.functional as F

    hs, ws = {-1: (h, w), 0: (h, br.split_size), 1: (br.split_size, w)}[br.idx]
    h_pad, w_pad = (hs - h % hs) % hs, (ws - w % ws) % ws
    top, left = h_pad // 2, w_pad // 2
    pad = (left, w_pad - left, top, h_pad - top)
    q, k, v = (F.pad(t, pad) for t in (q, k, v))
    hh, ww = h + h_pad, w + w_pad
    b, c = q.shape[:2]
    heads, d = br.num_heads, c // br.num_heads

    def win(t):  # img2windows + heads: (B', heads, n, d)
        t = t.view(b, c, hh // hs, hs, ww // ws, ws).permute(0, 2, 4, 3, 5, 1).reshape(-1, hs * ws, c)
        return t.reshape(-1, hs * ws, heads, d).permute(0, 2, 1, 3)

    vmap = v.view(b, c, hh // hs, hs, ww // ws, ws).permute(0, 2, 4, 1, 3, 5).reshape(-1, c, hs, ws)
    rpe = br.get_v(vmap).reshape(-1, heads, d, hs * ws).permute(0, 1, 3, 2)
    qw, kw, vw = win(q) * br.scale, win(k), win(v)
    x = (qw @ kw.transpose(-2, -1)).softmax(-1) @ vw + rpe
    x = x.transpose(1, 2).reshape(-1, hs * ws, c)
    x = x.view(b, hh // hs, ww // ws, hs, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(b, hh, ww, c)
    return x[:, top:top + h, left:left + w].reshape(b, h * w, c)


@pytest.mark.parametrize("idx", [0, 1, -1])
def test_cswin_stripes_pad_as_the_official_segmentation_backbone(idx):
    from vitedge.models.slab_cswin import LePEAttention

    br = LePEAttention(dim=8, resolution=14, idx=idx, split_size=7, num_heads=2).eval()  # stage 3 of a 224 model
    h, w = 16, 20  # a 256x320 input's stage-3 map: 7-wide stripes need padding both ways
    br.set_resolution((h, w))
    assert br.padded == (idx != -1)
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 8, h, w) for _ in range(3))
    tokens = [t.flatten(2).transpose(1, 2) for t in (q, k, v)]
    with torch.no_grad():
        torch.testing.assert_close(br(*tokens), _official_lepe_forward(br, q, k, v, h, w), rtol=1e-5, atol=1e-6)


def test_cswin_sla_stripes_padded_pass_the_ladder(tmp_path):
    # pretrained at 96 with 6-wide SLA stripes in stage 2 (12x12); at 64x96 that stage is 8x12: the horizontal
    # stripes (6 x 12) pad 8 rows to 12 (2 above, 2 below)
    name, _, _ = case("slab_cswin_two_branch")
    overrides = REDUCED["slab_cswin_two_branch"].kwargs(img_size=96, la_split_size="8-6-6-3")
    report = export(name, targets="onnx", imgsz=WIDE, overrides=overrides, out=tmp_path / "o", samples=8)
    assert report.exit_code == 0 and report.reparam.equivalence["passed"]
    assert any(r["tensor"] == "stage2.0.attns.1" and r["to"] == [12, 12] for r in report.resized), report.resized


# ---- the docs name every family's convention and its source ------------------------------------------------------

def test_docs_list_every_familys_size_convention_and_its_source():
    from pathlib import Path

    from vitedge.models.registry import get_spec, list_models

    text = (Path(__file__).resolve().parent.parent / "docs" / "models.md").read_text()
    section = text[text.index("## Input sizes"):]
    rows = {line.split("|")[1].strip(): line.split("|")[3] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| Family")}
    families = {"swiftformer": "SwiftFormer", "slab_deit": "SLAB-DeiT", "prepbn_deit": "PRepBN-DeiT",
                "sima_deit": "SimA-DeiT", "slab_swin": "SLAB-Swin", "prepbn_swin": "PRepBN-Swin",
                "slab_pvt": "SLAB-PVT", "prepbn_pvt": "PRepBN-PVT", "slab_cswin": "SLAB-CSWin", "sima_": "SimA (XCiT)"}
    for name in list_models():
        key = next(k for k in families if name.startswith(k))
        row = next((src for fams, src in rows.items() if families[key] in fams), None)
        assert row is not None, f"{name}: no row for {families[key]} in docs/models.md's Input sizes"
        # the source: the official repo's file and function (or timm's), where there is anything to follow
        assert key == "swiftformer" or (".py" in row and "`" in row), (name, row)
        assert " only" not in get_spec(name).accepted_sizes()  # every model takes other sizes


def test_a_deploy_checkpoint_keeps_a_non_square_size(tmp_path):
    from vitedge.exporter.flow.deploy_checkpoint import load_deploy_checkpoint, save_deploy_checkpoint
    from vitedge.exporter.reparam import reparameterize
    from vitedge.models import make_trained_like

    name, overrides, _ = case("slab_deit")
    deploy = reparameterize(make_trained_like(create_model(name, **overrides)).eval(), imgsz=WIDE)
    path = save_deploy_checkpoint(deploy, tmp_path / "d.pth", imgsz=WIDE)
    back = load_deploy_checkpoint(path)
    assert back.deploy_checkpoint_meta["imgsz"] == WIDE
    x = torch.randn(1, 3, *WIDE)
    with torch.no_grad():
        torch.testing.assert_close(back(x), deploy(x))


def test_bench_sets_the_reference_to_every_size_it_times():
    from vitedge.exporter.timing.bench_api import bench

    name, overrides, _ = case("slab_deit")  # pretrained at 224: both sizes resample its tables
    r = bench(name, backends=["torch-deploy"], imgsz=[64, 96], overrides=overrides, min_iters=3, max_s=0.2,
              warmup_s=0.01)
    assert [(x.imgsz, x.status) for x in r.results] == [(64, "ok"), (96, "ok")], [x.reason for x in r.results]


def test_the_committed_benchmark_has_the_chosen_order_faster_at_640_for_slab_deit():
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "attention_order.json"
    points = json.loads(path.read_text())["at_sizes"]["points"]
    p = next(p for p in points if (p["model"], p["imgsz"]) == ("slab_deit_tiny", "640x640"))
    assert p["orders_chosen"] == ["kv_first"] and not p["parity_problems"]
    for backend in ("onnxruntime", "executorch"):  # the bar: the chosen order at least 1.5x faster
        assert p[backend]["other_over_chosen"]["ci"][0] >= 1.5, (backend, p[backend]["other_over_chosen"])


def test_a_reused_verified_base_reports_what_its_train_form_changed(tmp_path):
    import dataclasses
    import shutil

    class Store:  # exporter/flow/verified_base.py BaseStore: get() / put(base), its files copied during put
        base = None

        def get(self):
            return self.base

        def put(self, base):
            kept = tmp_path / "kept.onnx"
            shutil.copyfile(base.onnx_path, kept)
            self.base = dataclasses.replace(base, onnx_path=kept)

    store = Store()
    name, overrides, _ = case("slab_deit")
    first = export(name, targets="onnx", imgsz=WIDE, overrides=overrides, out=tmp_path / "a", samples=8, base_store=store)
    again = export(name, targets="onnx", imgsz=WIDE, overrides=overrides, out=tmp_path / "b", samples=8, base_store=store)
    assert store.base is not None and first.resized and again.resized == first.resized


def test_a_specs_default_size_is_the_img_size_it_is_built_for():
    """What the matrix and the benchmarks run a model at when no size is asked for, without building it: the
    img_size of its overrides (its position tables' grid), else the spec's default."""
    from vitedge.models.registry import get_spec

    assert get_spec("slab_deit_tiny").default_size({"img_size": 64}) == 64
    assert get_spec("slab_deit_tiny").default_size() == 224 and get_spec("swiftformer_xs").default_size({}) == 224
