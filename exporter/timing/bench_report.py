"""The bench report (`vitedge bench --report`): its records, the table the CLI prints and the latency plot."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ...errors import VitedgeError
from ..core.settings import size_side, written


@dataclass
class BackendResult:
    backend: str
    imgsz: int
    status: str                       # "ok" | "failed" | "unavailable"
    reason: str | None = None
    mode: str | None = None           # runner mode (reference/device/emulated)
    load_s: float | None = None       # build / export / compile / session creation
    parity: dict | None = None        # metrics vs the train-form in float64
    parity_sets: dict | None = None   # per input set: noise_ratio, accuracy, ... (as report.json's parity[].sets)
    latency: dict | None = None       # LatencyStats.to_dict(): end to end (host <-> device copies included)
    valid: bool = False               # latency is only valid with passed parity
    gpu_compute: dict | None = None   # TensorRT: execution alone, CUDA events (trtexec's "GPU Compute Time")
    export: dict | None = None        # ONNX-based backends: how the graph was exported (exporter, fallback, opset)
    predictions: list | None = None   # --artifact carrying class names: top-1 names on the first parity inputs
    precision: str | None = None      # the artifact's precision whose tolerance profile judged its parity

    @property
    def key(self) -> str:
        return f"{self.backend}@{written(self.imgsz)}"


@dataclass
class BenchReport:
    model: str
    weights: str
    batch: int
    threads: int
    sizes: list
    results: list = field(default_factory=list)      # [BackendResult]
    ratios: list = field(default_factory=list)       # [{"imgsz", "numerator", "denominator", "ratio", "ci", "pairs"}]
    order: list = field(default_factory=list)        # `--order measured` results per size
    regressions: list = field(default_factory=list)  # entries beyond --max-regression
    baseline: str | None = None
    device: dict | None = None                       # --device iphone: the phone, its timings and parity
    reference: list = field(default_factory=list)    # per size: the train-form's float32 noise and accuracy
    artifact: dict | None = None                     # --artifact: what was timed, and whether parity ran (and why not)
    settings: dict = field(default_factory=dict)
    machine: dict = field(default_factory=dict)
    exit_code: int = 0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["results"] = [dict(asdict(r), key=r.key) for r in self.results]
        return d

    def p50_by_key(self) -> dict[str, float]:
        return {r.key: r.latency["p50_ms"] for r in self.results if r.valid and r.latency}


# ---- outputs ------------------------------------------------------------------------------------------

def format_table(report: BenchReport) -> str:
    rows = [("backend", "imgsz", "status", "load s", "p50 ms", "95% CI", "p90", "p99", "CV", "iters", "img/s")]
    for r in report.results:
        lat = r.latency
        if lat and r.valid:
            ci = f"{lat['p50_ci_ms'][0]:.3f}-{lat['p50_ci_ms'][1]:.3f}"
            rows.append((r.backend, written(r.imgsz), r.status, f"{r.load_s:.2f}", f"{lat['p50_ms']:.3f}", ci,
                         f"{lat['p90_ms']:.3f}", f"{lat['p99_ms']:.3f}", f"{lat['cv']:.3f}", str(lat["iters"]),
                         f"{lat['throughput']:.1f}"))
        else:
            rows.append((r.backend, written(r.imgsz), r.status, "-" if r.load_s is None else f"{r.load_s:.2f}",
                         "invalid" if r.status == "failed" else "-", "", "", "", "", "", ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    a = report.artifact
    if a:
        what = f"{a['format']}" + (f", {a['model']}" if a["model"] else "")
        lines.insert(0, f"artifact {a['path']} ({what}): parity " + (
            "checked first against the train-form" if a["parity"] == "run" else f"NOT RUN: {a['parity_reason']}"))
    for r in report.results:
        if r.reason:
            lines.append(f"  {r.backend}@{written(r.imgsz)}: {r.reason}")
        if r.predictions:
            from ..verdict.predictions import describe

            lines.append(f"  {r.backend}@{written(r.imgsz)}: top-1 on the first parity inputs: {describe(r.predictions)}")
        if r.gpu_compute and r.valid:
            lines.append(f"  {r.backend}@{written(r.imgsz)}: GPU compute p50 {r.gpu_compute['p50_ms']:.3f} ms "
                         f"(execution only); end to end with copies p50 {r.latency['p50_ms']:.3f} ms")
    for q in report.ratios:
        lines.append(f"ratio {q['numerator']}/{q['denominator']} @{written(q['imgsz'])}: {q['ratio']:.3f} "
                     f"(95% CI {q['ci'][0]:.3f}-{q['ci'][1]:.3f}, {q['pairs']} paired rounds)")
    for o in report.order:
        lines.append(f"order @{written(o['imgsz'])} on {o['backend']}: measured best {o['measured_best']}, FLOP rule "
                     f"{'/'.join(o['rule_choice'])}; qk_first/kv_first = {o['qk_over_kv']['ratio']:.3f}")
    for d in (report.device or {}).get("results", []):
        p = d["parity"]
        lines.append(f"iphone {report.device['name']} (iOS {report.device['os']}, {report.device['compute_units']}) "
                     f"@{written(d['imgsz'])}: load p50 {d['load_ms']['p50_ms']:.1f} ms, predict p50 "
                     f"{d['predict_ms']['p50_ms']:.3f} ms (p90 {d['predict_ms']['p90_ms']:.3f}); golden-vector "
                     f"parity {p['status'].upper()}" + (f" on {p['samples']} inputs (mode device)" if p["samples"]
                                                         else "")
                     + (f": {p['reason']}" if p.get("reason") else ""))
    for g in report.regressions:
        lines.append(f"REGRESSION {g['key']}: p50 {g['current_ms']:.3f} ms vs baseline {g['baseline_ms']:.3f} ms "
                     f"(+{g['regression_pct']:.1f}%)")
    return "\n".join(lines)


PLOT_HINT = "pip install 'vitedge[plot]'"


def require_matplotlib() -> None:
    """`--plot` needs matplotlib, an optional extra: VitedgeError (the CLI's exit 2) with the install hint when
    it cannot be imported. Call it before measuring, so a missing plotter costs no bench run."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise VitedgeError(f"--plot needs matplotlib, which is not installed: {PLOT_HINT} (or drop --plot)") from None


def write_plot(report: BenchReport, path: str | Path) -> Path:
    """Latency (p50 with its CI as error bars) vs resolution per backend; with --order measured, both orders."""
    require_matplotlib()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for b in dict.fromkeys(r.backend for r in report.results):
        pts = [(size_side(r.imgsz), r.latency) for r in report.results if r.backend == b and r.valid and r.latency]
        if not pts:
            continue
        xs = [p[0] for p in pts]
        ys = [p[1]["p50_ms"] for p in pts]
        err = np.array([[y - p[1]["p50_ci_ms"][0] for y, p in zip(ys, pts)],
                        [p[1]["p50_ci_ms"][1] - y for y, p in zip(ys, pts)]]).clip(min=0)
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=b)
    for order in ("qk_first", "kv_first"):
        pts = [(size_side(o["imgsz"]), o["latency"][order]) for o in report.order]
        if pts:
            ax.plot([p[0] for p in pts], [p[1]["p50_ms"] for p in pts], linestyle="--", marker="x",
                    label=f"{report.order[0]['backend']} {order}")
    ax.set_xlabel("input size (px; H x W at sqrt(H W))")
    ax.set_ylabel("p50 latency (ms), 95% CI")
    ax.set_title(f"{report.model}, batch {report.batch}, {report.threads or 'all'} thread(s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
