"""The summary `vitedge export` and `vitedge parity` print: the run, its hops as a table, the notes, the artifacts
and the verdict line."""
from __future__ import annotations

import os

from ...models.input_size import size_text


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def table(rows: list[tuple]) -> str:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def _accuracy(sets: dict, key: str) -> str:
    """A hop's accuracy over its labelled samples (only a labelled --images set carries labels) beside the float64
    train-form's on exactly the same samples: "hop / reference"."""
    d = next((d for d in sets.values() if d.get(key) is not None), None)
    if d is None:
        return "-"
    ref = d.get(f"reference_{key}")
    return _fmt(d[key], ".1%") + (f" / {ref:.1%}" if ref is not None else "")


def _reference_line(ref: dict) -> str:
    parts = [f"{k} median {d['reference_noise_median']:.1e} max {d['reference_noise']:.1e}"
             for k, d in ref.get("sets", {}).items()]
    line = (f"reference: train-form float32 vs float64 ({ref.get('float32_threads')} threads), noise per set: "
            + "; ".join(parts))
    if ref.get("top1_accuracy") is not None:
        line += f"; accuracy (float64) top-1 {ref['top1_accuracy']:.1%}, top-5 {ref['top5_accuracy']:.1%}"
    return line


def _map_outputs(report) -> bool:
    """Whether the outputs are feature maps or several (--features, a user's heads): the top-1 / top-5 agreement of
    their packed values says nothing (report.json keeps the fields; the table shows each hop's worst output)."""
    outs = report.outputs or []
    return len(outs) > 1 or any(len(o.get("shape") or ()) > 1 for o in outs)


def _worst_output(outputs: dict | None) -> str:
    if not outputs:
        return "-"
    name = max(outputs, key=outputs.get)
    return f"{name} {outputs[name]:.2f}"


def format_summary(report, report_path: str | None = None) -> str:
    from vitedge.exporter.verdict.predictions import describe
    from vitedge.exporter.onnx.onnx_export import norm_nodes

    lines = [f"{report.model}  imgsz {size_text(report.imgsz)}  batch {report.batch or 'dynamic'}  "
             f"weights: {report.weights}"
             + (" (seeded trained-like demo weights)" if report.weights == "untrained" else "")]
    r = report.reparam
    if r.folded or r.attention_order:
        orders = list(r.attention_order.values())
        lines.append(f"re-parameterization: folded {sum(r.folded.values())} ({', '.join(f'{k} {v}' for k, v in r.folded.items())}); "
                     f"unfolded {len(r.unfolded)}; attention: {orders.count('qk_first')} qk_first, "
                     f"{orders.count('kv_first')} kv_first; rewrites: {', '.join(r.rewrites) or 'none'}")
    if report.exporter:
        lines.append(f"ONNX exporter: {report.exporter}" + (f" (opset {report.opset})" if report.opset else "")
                     + (f"; dynamo could not export it: {report.exporter_fallback}" if report.exporter_fallback
                        else ""))
    ref = report.reference
    if ref:
        lines.append(_reference_line(ref))
    # per input set: the worst sample's error / allowance (<= 1 passes); with labels, accuracy on labelled images
    sets = [k for k in ("natural", "user", "stress") if any(k in (h.sets or {}) for h in report.parity)]
    labelled = bool(ref and ref.get("top1_accuracy") is not None)
    probed = any(h.probe for h in report.parity)
    weighed = any(h.weights for h in report.parity)
    maps, several = _map_outputs(report), len(report.outputs or []) > 1  # (several outputs are maps here too)
    agreement = ("worst output",) if several else () if maps else ("top-1", "top-5")
    rows = [("hop", "status", "mode", *(f"ratio {k}" for k in sets), *(("probe",) if probed else ()),
             *(("weights",) if weighed else ()), "max_rel",
             "cosine", "PSNR dB", *agreement, *(("acc@1 hop / ref", "acc@5 hop / ref") if labelled else ()),
             "backend")]
    for h in report.parity:
        m, hs = h.metrics, h.sets or {}
        acc = [_accuracy(hs, k) for k in ("top1_accuracy", "top5_accuracy")] if labelled else []
        rows.append((h.label(), h.status, h.mode_label(), *(_fmt(hs.get(k, {}).get("noise_ratio"), ".2f") for k in sets),
                     *(((h.probe or {}).get("status", "-"),) if probed else ()),
                     *(((h.weights or {}).get("status", "-"),) if weighed else ()),
                     _fmt(m and m.max_rel, ".2e"), _fmt(m and m.cosine, ".6f"), _fmt(m and m.psnr_db, ".1f"),
                     *((_worst_output(h.outputs),) if several else () if maps else
                       (_fmt(m and m.top1_agreement, ".1%"), _fmt(m and m.top5_agreement, ".1%"))), *acc, h.backend))
    lines += ["", table(rows)]
    if sets:
        lines.append("(vs the train-form in float64; ratio = worst sample's error / its allowance max(floor, K x "
                     "float32 noise), <= 1 passes" + ("; probe = the backbone's last feature map, judged alike"
                                                       if probed else "")
                     + ("; weights = the stored weights against the deploy-form's, per channel" if weighed else "")
                     + ("; worst output = the output with the largest ratio, and that ratio" if several else "")
                     + ("; acc = top-k accuracy on the labelled images the hop ran, beside the float64 train-form's "
                        "on the same images" if labelled else "") + ")")
    notes = [f"  {h.label()}: {h.status}: {h.reason}" for h in report.parity if h.reason]
    notes += [f"  {h.label()}: feature probe not run: {h.probe.get('why')}" for h in report.parity
              if (h.probe or {}).get("status") == "not run" and h.status == "passed"]
    notes += [f"  {h.label()}: weights check not run: {h.weights.get('why')}" for h in report.parity
              if (h.weights or {}).get("status") == "not run" and h.status == "passed"]
    notes += [f"  {h.label()}: Neural Engine residency {h.ane_residency['status'].upper()}: {h.ane_residency['reason']}"
              for h in report.parity if h.ane_residency]
    notes += [f"  {h.label()}: top-1 on the first parity inputs: {describe(h.predictions)}"
              for h in report.parity if h.predictions]
    if notes:
        lines += [""] + notes
    if report.artifacts:
        lines.append("")
        width = max(12, *(len(k) for k in report.artifacts))
        for key, a in report.artifacts.items():
            where = os.path.join(report.out_dir, a.path) if report.out_dir else a.path
            extra = ""
            if a.nodes is not None:
                extra = f"  {sum(a.nodes.values())} nodes, {norm_nodes(a.nodes)} normalization"
            elif "outside_delegate" in (a.info or {}):  # an ExecuTorch program: what its delegate left out
                left = a.info["outside_delegate"]
                extra = (f"  {a.info.get('backend')}: every op delegated" if a.info.get("fully_delegated") else
                         f"  {a.info.get('backend')}: outside the delegate: "
                         f"{', '.join(f'{k} x{v}' for k, v in left.items()) or 'every op (no delegate)'}")
            lines.append(f"  {key:<{width}} {a.precision:<5} {_size(a.bytes):>9}  sha256 {a.sha256[:12]}  {where}{extra}")
    unverified = [h.label() for h in report.unverified_hops()]
    lines.append("")
    if report.failed_hops():
        bad = report.failed_hops()[0]
        where = f" (diverging module: {bad.diverging_module})" if bad.diverging_module else ""
        q = f"; artifacts quarantined in {os.path.join(report.out_dir, report.quarantine)}" if report.quarantine else ""
        lines.append(f"FAILED: {', '.join(h.label() for h in report.failed_hops())}{where}{q}")
    elif report.exit_code:
        undecided = unverified + [f"{h.label()} (--require-ane inconclusive)" for h in report.inconclusive_checks()]
        lines.append(f"FAILED: --require-verified and unverified hops: {', '.join(undecided)}")
    else:
        lines.append("PASSED: every executed hop is within tolerance"
                     + (f"; UNVERIFIED (not counted as passed): {', '.join(unverified)}" if unverified else ""))
    if report_path:
        lines[-1] += f"   report: {report_path}"
    return "\n".join(lines)

