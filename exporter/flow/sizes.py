"""Several input sizes in one export (`--imgsz 224,256x320,320x256`): every size through the same ladder.

The train-form is built once; each size then runs the single-size pipeline (pipeline.py: its own deploy-form and
attention order, float64 gate, parity set, ground truth, ONNX export and base graph, each target judged by its own
hop) in its own folder inside the build folder. What is one file per size (ONNX, TensorRT, ...) is renamed for its
size, NAME_256x320.onnx; a target whose row has `entries` (CoreML functions, ExecuTorch methods) makes one
artifact of every size (`Target.lower_sizes`), with one hop per function or method, each judged against its
size's ground truth. The report keeps every single-size field (the first size's) and adds `sizes` and, per hop,
`size` and `entry` (exporter/core/report.py). The sizes are read from the settings as they are given, so whatever
the single-size pipeline accepts, this loop does too. pipeline.py's `export` dispatches here and passes its own
single-size stages (`prepare`, `start`, `finish`): this module does not import the pipeline back.
"""
from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ...errors import VitedgeError
from ...targets import row_of
from ..core import outdir
from ..core.progress import Progress
from ..core.report import Hop, Report
from ..core.settings import ExportSettings, size_entry, size_label
from ..onnx.onnx_export import save_onnx
from ..verdict.hops import record_artifact
from ..verdict.parity import failed, unverified
from .verified_base import BaseStore

SIZE_FOLDER = ".size-"  # each size's build folder inside the export's (gone once its files are renamed)


@dataclass
class _Size:
    """One size of the export: its label (HxW), its start (deploy-form, report) and its build."""
    label: str
    entry: str
    started: object  # pipeline.Started
    build: object    # pipeline._Build
    folder: Path


def one_file_plans(plans: list) -> list:
    """The plans whose target makes one artifact of every size (its row's `entries`)."""
    return [p for p in plans if row_of(p.name).entries]


def check_sizes(req, sizes: int, progress: Progress) -> None:
    """What one artifact of several sizes cannot take, before any work; the options each such target needs
    (CoreML: iOS 18) noted and set on its plan. A compressed precision needs nothing more: each size is compressed
    (and calibrated) on its own and its entry judged against that size's emulation of the kind."""
    if req.train_form_args.get("features") is not None:  # each size's maps have their own shapes: one size per run
        raise VitedgeError("--features with several --imgsz sizes: export the feature maps one size per run for now "
                           "(drop all but one size)")
    for plan in one_file_plans(req.plans):
        if plan.target is not None:
            plan.options = plan.target.plan_sizes(sizes, plan.options)
            if plan.options.get("ios_raised"):
                progress.note(plan.options["ios_raised"])


def export_sizes(s: ExportSettings, progress: Progress, stages, base_store: BaseStore | None = None) -> Report:
    """`export()` of several sizes (s.imgsz holds more than one): one output folder, one report. `stages`: the
    single-size pipeline (pipeline.py: prepare, start, finish)."""
    if base_store is not None:
        raise VitedgeError("a shared verified base holds one input size; export several sizes without base_store= "
                           "(a `vitedge matrix` cell is one size)")
    req = stages.prepare(s, progress)
    check_sizes(req, len(s.imgsz), progress)
    several = one_file_plans(req.plans)
    each = [p for p in req.plans if p not in several]
    done: list[_Size] = []
    with outdir.InterruptWatch() as interrupts:
        with outdir.OutputFolder(req.out, s.force, interrupts) as folder:
            loaded = None
            for i, (size, one) in enumerate(zip(s.imgsz, s.per_size()), 1):
                label = size_label(size)
                progress.note(f"input size {label} ({i} of {len(s.imgsz)})")
                started = stages.start(req, one, progress, loaded=loaded)
                loaded = started.loaded  # one train-form for every size
                sub = folder.tmp / f"{SIZE_FOLDER}{label}"
                sub.mkdir()
                build = started.build(sub, folder.checkpoint, each)
                build.run()
                done.append(_Size(label, size_entry(size), started, build, sub))
            one_file = [(plan, *_one_file_hops(plan, done, folder.tmp, progress, stages.SKIPPED)) for plan in several]
            report = _merge(done, folder.tmp)  # (after those hops: they add to each size's analyses)
            for plan, hops, art in one_file:
                if art is not None:
                    record_artifact(report, plan.hop(), art.path, art.precision, art.info, root=folder.tmp)
                report.parity += hops
            for d in done:
                shutil.rmtree(d.folder, ignore_errors=True)
            stages.finish(report, folder, lambda q: _save_raws(done, q), req.out)
    return report


def _renamed(name: str, model: str, label: str) -> str:
    """A size's file name in the export folder: NAME.onnx -> NAME_224x224.onnx (other files: 224x224_FILE)."""
    return f"{model}_{label}{name[len(model):]}" if name.startswith(f"{model}.") else f"{label}_{name}"


def _merge(done: list[_Size], tmp: Path) -> Report:
    """The first size's report with every size's hops (`size` set), its files renamed for their size and moved into
    the export folder (artifacts keyed KEY@HxW), and `sizes`."""
    report = done[0].started.report
    own = [(d, d.started.report.artifacts, d.started.report.parity) for d in done]
    report.artifacts, report.parity, report.sizes = {}, [], []
    for d, artifacts, parity in own:
        r = d.started.report
        for item in sorted(d.folder.iterdir()):
            item.rename(tmp / _renamed(item.name, r.model, d.label))
        files = {}
        for key, a in artifacts.items():
            head, _, rest = a.path.partition("/")
            a.path = "/".join(filter(None, (_renamed(head, r.model, d.label), rest)))
            report.artifacts[f"{key}@{d.label}"] = files[key] = a
        for h in parity:
            h.size = d.label
        report.parity += parity
        report.sizes.append(size_row(d.label, d.entry, r, {k: a.path for k, a in files.items()}))
    return report


def size_row(label: str, entry: str | None, report: Report, files: dict) -> dict:
    """report.json's `sizes` entry of one size (`report`: that size's own run; `files`: {artifact key: path})."""
    return {"size": label, "imgsz": [int(v) for v in label.split("x")], "entry": entry, "files": files,
            "samples": report.samples, "reparam": asdict(report.reparam), "reference": report.reference}


def _one_file_hops(plan, done: list[_Size], tmp: Path, progress: Progress, skipped: str) -> tuple[list[Hop], object]:
    """`plan`'s one artifact of every size and one hop per size (its function or method): (hops, the Artifact or
    None where it was not made); `skipped`: the reason of a hop not run after an earlier step failed."""
    hop_name, t = plan.hop(), plan.target
    hops, parts = {}, {}
    for d in done:
        if d.build.ready is None:
            hops[d.label] = unverified(hop_name, plan.name, skipped)
            continue
        spec = d.build.targets.spec(plan, *d.build.ready)
        if isinstance(spec, Hop):
            hops[d.label] = spec
        else:
            parts[d.entry] = (d.started.deploy, spec)
    if hops:  # one size cannot be lowered: nor can the artifact of every size
        bad = next(iter(hops))
        why = f"not made: the {plan.name} artifact holds every size, and size {bad} was not lowered"
        return _tagged({d.label: hops.get(d.label) or unverified(hop_name, plan.name, why) for d in done}, done), None
    path = tmp / t.file_name(done[0].started.report.model, plan.precision)  # (NAME.int8.pte, as one size names it)
    tol = done[0].build.targets.tolerance(plan)
    try:
        with progress.step(f"lowering {len(parts)} sizes to one {t.name} artifact ({plan.precision})"):
            art = t.lower_sizes(parts, path)
    except VitedgeError:
        raise
    except Exception as e:  # (UnavailableError too: the message says so)
        return _tagged({d.label: failed(hop_name, t.name, f"lowering {len(parts)} sizes to {t.name} failed: "
                                        f"{type(e).__name__}: {e}", tolerance=tol) for d in done}, done), None
    out = {}
    for d in done:
        with progress.step(f"{hop_name}: {row_of(plan.name).entries} {d.entry}"):
            out[d.label] = d.build.targets.judge(plan, replace(art, entry=d.entry), d.build.ready[2], record=False)
    return _tagged(out, done), art


def _tagged(hops: dict, done: list[_Size]) -> list[Hop]:
    """The hops in size order, each with its size and the function / method it ran."""
    out = []
    for d in done:
        h = hops[d.label]
        h.size, h.entry = d.label, d.entry
        out.append(h)
    return out


def _save_raws(done: list[_Size], folder: Path) -> None:
    """Every size's unsimplified graph, for the quarantine of a failed run."""
    for d in done:
        if d.build.raw is not None:
            save_onnx(d.build.raw, folder / f"{d.started.report.model}_{d.label}.raw.onnx")
