"""Every registered model through `vitedge export --target onnx` at its default size with its seeded demo weights:
does the correct export pass, how far inside its allowance, and what is the smallest planted error it catches.

Per model (smallest first, so a partial run covers the most models; the JSON is rewritten after each):
- the export exactly as `vitedge export --model NAME --target onnx` runs it (default settings: the default
  parity set, its size chosen by the GMACs rule (exporter/verdict/parity_cost.py) unless --samples), its exit code, wall
  time and sample count;
- the train-form's intrinsic float32 noise per input set (report.json `reference`), each hop's worst
  error / allowance (noise_ratio) and worst-sample error per set;
- each ONNX hop's feature probe (exporter/verdict/probe.py): the module, its worst noise_ratio per set;
- sensitivity: one output channel of the mid-network Conv/Gemm/MatMul weight of the exported ONNX scaled by 1.01
  and by 1.001 (targets/plants.py), each judged like `vitedge parity` judges an ONNX artifact (same parity set,
  same ground truth: the export's own, reused, no second float64 run; `Ladder.onnx_hop`: logits, feature probe,
  localization), with the module localization names, the module whose weight was planted (`planted_module`:
  the deploy-form parameter the planted initializer held, matched by value) and `caught_by` (logits or feature probe).
  Some mid-network weights are numerically blind to a per-channel scale: SimA's q/k projections are
  l1-normalized over tokens right after, so scaling one channel's weights changes the output only through that
  channel's bias. A plant whose x1.01 moves neither the logits (ONNX Runtime, planted vs unplanted, first 16
  inputs) by more than 2x the model's median float32 noise nor the feature probe's tensor by more than 2x the
  float32 noise there is recorded as `invisible` and the next weight along the graph is planted instead; both factors use the node so chosen. Grouped (depthwise) Convs are passed over too (one
  output channel is one k x k filter: see visible_position); `plant_effect_x1.01` records the chosen plant's
  effect on the logits. `--update --models a,b` re-measures those models into the existing results file.
The summary printed last: status, worst noise_ratio per set, noise medians, the smallest factor caught.
Correctness figures only: wall times under load are indicative.

    python benchmarks/all_models.py [--quick] [--models a,b] [--samples N] [--out FILE]

--quick: two reduced configs (the smoke test), not a result to quote.
"""
from __future__ import annotations

import contextlib
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

import _corpus
import _graphs
import _script
from _tables import load
from vitedge.exporter.verdict import hops
from vitedge.exporter.verdict.parity_cost import SAMPLES_RULE
from vitedge.exporter.verdict.criteria import sample_errors
from vitedge.exporter.verdict.parity import FLOAT64_TOLERANCES, run_batched
from vitedge.exporter.verdict.probe import deploy_reference, onnx_tensor, probe_point
from vitedge.exporter.flow.pipeline import export
from vitedge.models import get_spec, list_models
from vitedge.targets.onnx.target import OnnxRuntimeRunner
from vitedge.targets.plants import plant_channel_scale, planted_module, weight_nodes

QUICK_MODELS = ("swiftformer_xs", "sima_nano_12_p16")  # --quick: their reduced configs (_corpus.REDUCED) at 64 px
QUICK_SAMPLES = 8
QUICK_IMGSZ = 64
FACTORS = (1.01, 1.001)
EFFECT_SAMPLES = 16  # inputs on which a plant's effect on the logits is measured (visible_position)


@contextlib.contextmanager
def keep_ladder(store: dict):
    """Keep the export's Ladder (parity set + ground truth) so the planted artifacts reuse it."""
    build = hops.Ladder.build.__func__

    def spy(cls, *a, **kw):
        store["ladder"] = build(cls, *a, **kw)
        return store["ladder"]

    hops.Ladder.build = classmethod(spy)
    try:
        yield store
    finally:
        hops.Ladder.build = classmethod(build)


def _grouped(node: onnx.NodeProto) -> bool:
    return node.op_type == "Conv" and any(a.name == "group" and a.i > 1 for a in node.attribute)


def visible_position(graph: onnx.ModelProto, ladder, noise: float) -> tuple[float, list[dict], float]:
    """The first dense weight from the middle of the graph whose x1.01 plant changes what the ladder looks at by
    more than 2 x the float32 noise there: the logits (vs `noise`) or the feature probe's tensor (vs the
    deploy-form's float32 noise at that module, exporter/verdict/probe.py), as plant_channel_scale's `position`; the
    plants passed over; the chosen plant's effect on the logits (max over the inputs of max|dy| / max|y|).
    Grouped (depthwise) Convs are passed over: one of their output channels is a single k x k filter, whose 1 %
    change moves the logits of these models by 3-10x their float32 noise, inside the spread of correct hops (all_models'
    first full run). A plant blind at both places (SimA's l1-normalized q/k channels) is `invisible`; one that
    moves only the feature map (a mid-network SimA-XCiT MLP channel, pooled away before the logits) is planted:
    that is what the probe is for."""
    x = ladder.x[:EFFECT_SAMPLES]
    nodes = weight_nodes(graph)
    n = len(nodes)
    y = run_batched(OnnxRuntimeRunner(graph), x)
    scale = np.abs(y).max(axis=1)
    point = probe_point(graph, ladder.deploy, x)
    if point is not None:
        y64, y32 = deploy_reference(ladder.deploy, point[0], x)
        f0 = onnx_tensor(graph, point[1], x)
        f_noise = float(np.median(sample_errors(y64, y32)))
    skipped = []
    for k in range(n // 2, n):
        if _grouped(nodes[k][0]):
            skipped.append({"node": nodes[k][0].name, "why": "grouped (depthwise) Conv"})
            continue
        position = (k + 0.5) / n
        bad, where = plant_channel_scale(graph, FACTORS[0], position)
        effect = float((np.abs(run_batched(OnnxRuntimeRunner(bad), x) - y).max(axis=1) / scale).max())
        f_effect = (float(sample_errors(f0, onnx_tensor(bad, point[1], x)).max()) if point is not None else 0.0)
        if effect > 2 * noise or (point is not None and f_effect > 2 * f_noise):
            return position, skipped, effect
        skipped.append({"node": where.node, "channel": where.channel, "effect": effect, "feature_effect": f_effect})
    return 0.5, skipped, float("nan")


def _planted_module(graph: onnx.ModelProto, where, deploy) -> str | None:
    """The module whose weight was planted; None where no single deploy-form parameter holds the planted values."""
    try:
        return planted_module(graph, where, deploy)
    except ValueError:
        return None


def sets_summary(hop) -> dict:
    return {s: {"noise_ratio": d["noise_ratio"], "error": (d.get("worst_sample") or {}).get("error"),
                "allowance": (d.get("worst_sample") or {}).get("allowance"), "reference_noise": d["reference_noise"]}
            for s, d in (hop.sets or {}).items()}


def probe_summary(hop) -> dict | None:
    p = hop.probe or None
    return p and {k: p.get(k) for k in ("status", "module", "samples", "noise_ratio", "sets", "why")}


def _caught_by(hop) -> str | None:
    if hop.status != "failed":
        return None
    logits = any((d.get("noise_ratio") or 0) > 1 for d in (hop.sets or {}).values())
    return "logits" if logits else "feature probe" if (hop.probe or {}).get("status") == "failed" else "other"


def measure(name: str, samples: int | None, work: Path, overrides: dict | None = None, imgsz: int | None = None) -> dict:
    spec = get_spec(name)
    store: dict = {}
    t0 = time.perf_counter()
    with keep_ladder(store):
        report = export(name, "onnx", out=work / name, samples=samples, overrides=overrides, imgsz=imgsz)
    wall = time.perf_counter() - t0
    out = {"model": name, "family": spec.family, "overrides": overrides or {}, "imgsz": report.imgsz,
           "samples": report.samples, "samples_rule": report.samples_rule,
           "exit_code": report.exit_code, "status": report.status, "export_wall_s": round(wall, 1),
           "intrinsic_noise": {s: {"median": d["reference_noise_median"], "max": d["reference_noise"]}
                               for s, d in ((report.reference or {}).get("sets") or {}).items()},
           "hops": {h.hop: {"status": h.status, "reason": h.reason, "sets": sets_summary(h), "probe": probe_summary(h)}
                    for h in report.parity},
           "planted": {}, "smallest_caught": None, "measured_in": "this run",
           "rule": {"noise_floor": FLOAT64_TOLERANCES["fp32"].noise_floor,
                    "noise_k": FLOAT64_TOLERANCES["fp32"].noise_k}}
    ratios = [d["noise_ratio"] for h in out["hops"].values() for d in h["sets"].values() if d["noise_ratio"]]
    out["worst_noise_ratio"] = {s: max((h["sets"][s]["noise_ratio"] for h in out["hops"].values()
                                        if s in h["sets"] and h["sets"][s]["noise_ratio"] is not None), default=None)
                                for s in ("natural", "stress")}
    out["worst_noise_ratio_any"] = max(ratios, default=None)
    probes = [h["probe"] for h in out["hops"].values() if h["probe"]]
    out["worst_probe_ratio"] = max((p["noise_ratio"] for p in probes if p.get("noise_ratio") is not None), default=None)
    out["probe_not_run"] = [p.get("why") for p in probes if p.get("status") == "not run"]
    ladder = store.get("ladder")
    artifact = report.artifacts.get("onnx")
    if ladder is None or artifact is None or report.exit_code != 0:
        out["wall_s"] = round(time.perf_counter() - t0, 1)
        return out
    graph = onnx.load(str(work / name / artifact.path))
    tol = FLOAT64_TOLERANCES["fp32"]
    noise = min(d["median"] for d in out["intrinsic_noise"].values())
    position, out["invisible_plants"], out["plant_effect_x1.01"] = visible_position(graph, ladder, noise)
    for f in FACTORS:
        bad, where = plant_channel_scale(graph, f, position)
        hop = ladder.onnx_hop("onnx", bad, tol)  # as `vitedge parity` judges it: logits, feature probe, localization
        out["planted"][f"x{f}"] = {"caught": hop.status == "failed", "node": where.node, "op": where.op,
                                   "channel": where.channel, "sets": sets_summary(hop), "probe": probe_summary(hop),
                                   "caught_by": _caught_by(hop), "diverging_module": hop.diverging_module,
                                   "planted_module": _planted_module(graph, where, ladder.deploy)}
    caught = [f for f in FACTORS if out["planted"][f"x{f}"]["caught"]]
    out["smallest_caught"] = min(caught, key=lambda f: abs(f - 1)) if caught else None
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


def _cost(name: str) -> float:
    try:
        return _graphs.gflop(name, get_spec(name).default_imgsz)
    except Exception:
        return 0.0


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def main() -> None:
    p = _script.parser("all_models", __doc__)
    p.add_argument("--models", default=None, help="comma-separated model names (default: all registered)")
    p.add_argument("--samples", type=int, default=None,
                   help=f"parity samples per model (default: the export's, by the GMACs rule; --quick "
                        f"{QUICK_SAMPLES})")
    p.add_argument("--update", action="store_true",
                   help="re-measure only --models and replace their rows in the existing results file")
    args = p.parse_args()
    names = args.models.split(",") if args.models else (list(QUICK_MODELS) if args.quick else list_models())
    names.sort(key=_cost)
    samples = args.samples or (QUICK_SAMPLES if args.quick else None)
    info = _script.machine()
    _script.banner("all_models", info, args.quick)
    started = time.time()
    path = Path(_script.out_path("all_models", args))
    rows, kept, old = [], [], {}
    if args.update and path.is_file():  # the other models' rows stay as measured, in cost order
        old = {r["model"]: r for r in json.loads(path.read_text())["models"]}
        kept = [r for m, r in old.items() if m not in names]
    with tempfile.TemporaryDirectory(prefix="vitedge-all-models-") as tmp:
        for name in names:
            r = (measure(name, samples, Path(tmp), _corpus.REDUCED.get(name), QUICK_IMGSZ) if args.quick
                 else measure(name, samples, Path(tmp)))
            rows.append(r)
            pending = [old[n] for n in names[len(rows):] if n in old]  # an interrupted --update keeps their old rows
            body = {"settings": {"target": "onnx", "samples": samples or f"export default ({SAMPLES_RULE})", "weights": "make_trained_like(seed=0)",
                                 "factors": list(FACTORS), "rule": {"noise_floor": FLOAT64_TOLERANCES["fp32"].noise_floor,
                                                                    "noise_k": FLOAT64_TOLERANCES["fp32"].noise_k}},
                    "models": sorted(kept + rows + pending, key=lambda r: _cost(r["model"])),
                    "complete": len(rows) == len(names) and (not args.update or len(kept + rows) == len(list_models()))}
            _script.write_results(path, "all_models", dict(info), args, body, started)  # survives an interrupted run
            w = r["worst_noise_ratio"]
            print(f"{name:20s} exit {r['exit_code']}  worst ratio natural {_fmt(w['natural'], '.2f')} stress "
                  f"{_fmt(w['stress'], '.2f')}  smallest caught {r['smallest_caught']}  ({r['samples']} samples, "
                  f"{r['wall_s']} s)", flush=True)
    allrows = sorted(kept + rows, key=lambda r: _cost(r["model"]))
    print(f"\nall_models: {len(allrows)} models, {samples or 'the GMACs rule (' + SAMPLES_RULE + ')'} samples each; rule floor "
          f"{FLOAT64_TOLERANCES['fp32'].noise_floor:g}, K {FLOAT64_TOLERANCES['fp32'].noise_k:g}")
    print(f"{'model':20s} {'exit':>4s} {'noise nat':>9s} {'noise str':>9s} {'ratio nat':>9s} {'ratio str':>9s} "
          f"{'probe':>6s} {'caught':>7s} {'samples':>7s} {'wall s':>7s}")
    for r in allrows:
        nz, w = r["intrinsic_noise"], r["worst_noise_ratio"]
        print(f"{r['model']:20s} {r['exit_code']:>4d} {_fmt(nz.get('natural', {}).get('median'), '9.1e')} "
              f"{_fmt(nz.get('stress', {}).get('median'), '9.1e')} {_fmt(w['natural'], '9.2f')} "
              f"{_fmt(w['stress'], '9.2f')} {_fmt(r.get('worst_probe_ratio'), '6.2f')} {str(r['smallest_caught']):>7s} {r['samples']:>7d} {r['wall_s']:7.1f}")
    passed = sum(r["exit_code"] == 0 for r in allrows)
    print(f"exit 0: {passed}/{len(allrows)}; x1.01 caught in {sum(bool(r['planted'].get('x1.01', {}).get('caught')) for r in allrows)}"
          f", x1.001 in {sum(bool(r['planted'].get('x1.001', {}).get('caught')) for r in allrows)}")
    print(f"results: {path}")


# ---- tables: what scripts/render_benchmarks.py writes into the READMEs and docs/ from this script's JSON ----


def all_models_summary() -> str:
    """What benchmarks/results/all_models.json holds, counted from its rows."""
    d = load("all_models.json")
    ms, rule = d["models"], d["settings"]["rule"]
    n = len(ms)
    today = sum(m.get("rule") == rule for m in ms)
    missed = [m["model"] for m in ms if not m["planted"]["x1.01"]["caught"]]
    probe = sum(m.get("measured_in") == "this run" for m in ms)
    worst = [max(m["worst_noise_ratio"].values()) for m in ms]
    return (f"`benchmarks/results/all_models.json` as committed: {n} models, {sum(m['exit_code'] == 0 for m in ms)} "
            f"exit 0, the worst hop at {min(worst):.2f}–{max(worst):.2f} of its allowance on the logits; × 1.01 "
            f"caught in {n - len(missed)} of {n} rows" + (f" (not in {', '.join(missed)})" if missed else "")
            + f", × 1.001 in {sum(m['planted']['x1.001']['caught'] for m in ms)} of {n}; "
            + ("every row measured with the feature probe" if probe == n else
               f"{probe} rows measured with the feature probe, {n - probe} from the earlier run without it")
            + " (`measured_in`); "
            + ("every row" if today == n else f"{today} rows") + f" judged by today's fp32 rule (floor "
            f"{rule['noise_floor']:g}, K {rule['noise_k']:g})"
            + (f", {n - today} by an earlier one" if today < n else "")
            + " (each row's `rule`).")


TABLES = {"all_models_summary": all_models_summary}


if __name__ == "__main__":
    main()
