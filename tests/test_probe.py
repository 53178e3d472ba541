"""The feature probe (exporter/verdict/probe.py): an ONNX hop is also judged on the backbone's last feature map.

Full-size SimA-XCiT is the case it exists for: one output channel of a mid-network MLP projection scaled by 1.01
moves the logits by only a few times the model's own float32 noise (the class-token head reads a pooled
summary), inside the logits allowance, while the token map before the head moves by tens of allowances.
"""
from __future__ import annotations

import json

import onnx

from vitedge.cli import main
from vitedge.exporter.core.report import Report
from vitedge.targets.plants import plant_channel_scale, weight_nodes

FULL = "sima_tiny_12_p16"   # full size, default 224 px, demo weights
PLANT_OWNER = "blocks.6.mlp.fc2"
SAMPLES = "8"               # 6 natural + 2 stress: enough for the verdict, quick at full size


def _position_of(graph: onnx.ModelProto, bias_name: str) -> float:
    """plant_channel_scale's position for the weight node whose bias is `bias_name`."""
    nodes = weight_nodes(graph)
    k = next(i for i, (node, _, _) in enumerate(nodes) if bias_name in node.input)
    return (k + 0.5) / len(nodes)


def test_probe_catches_a_channel_error_the_logits_pool_away(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["-q", "export", "--model", FULL, "--samples", SAMPLES, "--out", str(out)]) == 0
    report = Report.read(out / "report.json")
    for hop in report.parity[1:]:
        assert hop.probe["status"] == "passed" and hop.probe["noise_ratio"] <= 1, hop.probe
        assert hop.probe["samples"] == int(SAMPLES) and set(hop.probe["sets"]) == {"natural", "stress"}
    graph = onnx.load(str(out / f"{FULL}.onnx"))
    bad, where = plant_channel_scale(graph, 1.01, _position_of(graph, f"{PLANT_OWNER}.bias"))
    assert where.op == "Gemm"
    path = tmp_path / "planted.onnx"
    onnx.save(bad, str(path))
    capsys.readouterr()
    rep_path = tmp_path / "parity.json"
    rc = main(["-q", "parity", "--model", FULL, "--artifact", str(path), "--samples", SAMPLES, "--report",
               str(rep_path)])
    printed = capsys.readouterr().out
    hop = json.loads(rep_path.read_text())["parity"][1]
    assert rc == 1 and hop["hop"] == "onnx" and hop["status"] == "failed", hop
    # the logits alone would pass it: every set within its allowance ...
    assert all(s["noise_ratio"] <= 1 for s in hop["sets"].values()), hop["sets"]
    # ... the probe does not, and localization names the planted projection
    assert hop["probe"]["status"] == "failed" and hop["probe"]["noise_ratio"] > 5, hop["probe"]
    assert hop["diverging_module"] == PLANT_OWNER, hop["reason"]
    assert "feature probe" in hop["reason"] and f"diverging module: {PLANT_OWNER}" in printed


def test_probe_says_not_run_where_no_module_maps(tmp_path):
    """A graph whose names carry no module scopes (renamed nodes, tensors and initializers): the logits verdict
    stands, and the probe says plainly that it did not run, and why."""
    name, args = "swiftformer_xs", ["--set", "layers=[1,1,2,1]", "--set", "embed_dims=[16,24,32,48]",
                                    "--set", "num_classes=10", "--imgsz", "64"]
    out = tmp_path / "run"
    assert main(["-q", "export", "--model", name, *args, "--samples", SAMPLES, "--out", str(out)]) == 0
    graph = onnx.load(str(out / f"{name}.onnx"))
    outputs = {o.name for o in graph.graph.output} | {i.name for i in graph.graph.input}
    rename = {}
    for i, init in enumerate(graph.graph.initializer):
        rename[init.name] = f"w{i}"
        init.name = f"w{i}"
    for i, node in enumerate(graph.graph.node):
        node.name = f"n{i}"
        for j, t in enumerate(node.output):
            if t not in outputs:
                rename[t] = f"t{i}_{j}"
                node.output[j] = rename[t]
    for node in graph.graph.node:
        for j, t in enumerate(node.input):
            node.input[j] = rename.get(t, t)
    del graph.graph.value_info[:]
    path = tmp_path / "anonymous.onnx"
    onnx.save(graph, str(path))
    rep_path = tmp_path / "parity.json"
    rc = main(["-q", "parity", "--model", name, *args, "--artifact", str(path), "--samples", SAMPLES,
               "--report", str(rep_path)])
    hop = json.loads(rep_path.read_text())["parity"][1]
    assert rc == 0 and hop["status"] == "passed", hop
    assert hop["probe"]["status"] == "not run" and "maps" in hop["probe"]["why"], hop["probe"]
    # under --require-verified an unchecked feature map is not a pass
    rc = main(["-q", "parity", "--model", name, *args, "--artifact", str(path), "--samples", SAMPLES,
               "--report", str(rep_path), "--require-verified"])
    hop = json.loads(rep_path.read_text())["parity"][1]
    assert rc == 1 and hop["status"] == "unverified" and "feature probe did not run" in hop["reason"], hop


def test_a_probe_that_raises_leaves_the_hop_unverified(tmp_path, capsys, monkeypatch):
    """A check that raised is never a pass: the hop is unverified with the exception in its reason, the summary
    shows the probe's status, and --require-verified exits 1."""
    from vitedge.exporter.verdict import hops

    def broken(*a, **k):
        raise RuntimeError("planted probe failure")

    monkeypatch.setattr(hops, "probe_point", broken)
    name, args = "swiftformer_xs", ["--set", "layers=[1,1,2,1]", "--set", "embed_dims=[16,24,32,48]",
                                    "--set", "num_classes=10", "--imgsz", "64", "--samples", SAMPLES]
    out = tmp_path / "run"
    capsys.readouterr()
    assert main(["export", "--model", name, *args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    report = Report.read(out / "report.json")
    onnx_hops = [h for h in report.parity if h.hop.startswith("onnx")]
    assert onnx_hops and all(h.status == "unverified" and h.probe["status"] == "error" for h in onnx_hops)
    assert all("planted probe failure" in h.reason for h in onnx_hops)
    assert "probe" in printed.splitlines()[next(i for i, ln in enumerate(printed.splitlines())
                                                 if ln.lstrip().startswith("hop"))]
    assert "UNVERIFIED (not counted as passed)" in printed
    assert main(["-q", "export", "--model", name, *args, "--out", str(tmp_path / "strict"),
                 "--require-verified"]) == 1
    assert Report.read(tmp_path / "strict" / "report.json").status == "failed"
