"""What every app bundle shares (`vitedge package`, CoreML in package.py, ExecuTorch in package_android.py): the
--out checks, the export-then-assemble flow that writes no zip when a hop or the golden vectors fail, the golden
vectors themselves, and the deterministic zip (sorted entries, fixed timestamps and permissions)."""
from __future__ import annotations

import copy
import hashlib
import io
import json
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...errors import VitedgeError
from ...models.features import pack
from ...targets.threads import one_thread
from ..core import outdir
from ...models.input_size import canonical
from ...models.outputs import column_slices
from ..quantize.calibrate import calibration_photos
from ..quantize.compressed import resolution_bounds
from ..verdict.inputs import natural_inputs, parity_inputs
from ..verdict.parity import compute_metrics

GOLDEN_SAMPLES = 8          # golden vectors per bundle
GOLDEN_SEED = 1             # their parity-input seed (the ladder uses seed 0)
ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest date a zip can carry: no wall clock in the bytes
METRIC_DIGITS = 6           # significant digits of metrics in manifest.json (readability: one_thread fixes the bits)


class GoldenMismatch(RuntimeError):
    """The package passed its parity hop but not its own golden vectors: a failed check (exit 1), no zip."""


@dataclass
class PackageResult:
    path: Path | None           # the zip, or None when a parity hop failed
    exit_code: int              # 0 written, 1 a hop failed (nothing written)
    report: object              # the export Report
    manifest: dict | None
    export_dir: Path | None     # kept for inspection when a hop failed
    reason: str | None = None   # why no zip was written (exit_code 1)
    hop: str | None = None      # the parity hop of the bundled artifact (its report entry: report.hop(hop))


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _round(v):
    if isinstance(v, float):
        return float(f"{v:.{METRIC_DIGITS}g}")
    if isinstance(v, dict):
        return {k: _round(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_round(x) for x in v]
    return v


def _npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def _json_bytes(d: dict) -> bytes:
    return (json.dumps(d, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


def _hop_entry(hop) -> dict:
    """A report hop without wall time (it would change the bytes on every run)."""
    d = {"hop": hop.hop, "backend": hop.backend, "status": hop.status, "mode": hop.mode, "reason": hop.reason,
         "samples": hop.samples}
    if hop.metrics is not None:
        d["metrics"] = _round({k: v for k, v in vars(hop.metrics).items()})
    if hop.tolerance is not None:
        d["tolerance"] = {k: v for k, v in vars(hop.tolerance).items() if v is not None}
    if hop.sets:  # per input set, against the float64 ground truth
        d["sets"] = {k: _round({f: v.get(f) for f in ("samples", "noise_ratio", "reference_noise", "top1_accuracy",
                                                       "top5_accuracy")}) for k, v in hop.sets.items()}
    return d


def _portable_reference(reference: dict | None) -> dict | None:
    """report.json's `reference` without what belongs to this machine and run: whether the float64 ground truth was
    computed or read from the disk cache, and where that cache lies. A repeat must be byte-identical (the first
    run stores the truth, the repeat reads it) and a bundle must not carry a local path; the cache key (a digest
    of what the truth depends on) stays."""
    if not reference or not isinstance(reference.get("cache"), dict):
        return reference
    return {**reference, "cache": {k: v for k, v in reference["cache"].items() if k not in ("status", "path")}}


def write_deterministic_zip(files: dict[str, bytes], path: Path) -> None:
    """`files`: archive name -> bytes. Sorted, fixed date/permissions, deflate level 9."""
    tmp = path.with_name(f".{path.name}.tmp")
    with zipfile.ZipFile(tmp, "w") as zf:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            info.create_system = 3  # unix, whatever the host
            zf.writestr(info, files[name], compresslevel=9)
    tmp.replace(path)


def _tree_files(root: Path, prefix: str) -> dict[str, bytes]:
    return {f"{prefix}/{p.relative_to(root).as_posix()}": p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def normalize_pixels(pixels_nchw: np.ndarray, mean, std) -> np.ndarray:
    """8-bit RGB pixels (NCHW) as the model's float32 input: (p / 255 - mean) / std, channel by channel."""
    m = np.asarray(mean, np.float32).reshape(1, 3, 1, 1)
    s = np.asarray(std, np.float32).reshape(1, 3, 1, 1)
    return ((pixels_nchw.astype(np.float32) / 255.0 - m) / s).astype(np.float32)


def golden_vectors(model, imgsz: int, mean, std, n: int = GOLDEN_SAMPLES,
                   natural: bool = False, recipe=None) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 NHWC RGB pixels, float32 train-form logits on exactly those pixels). `natural`: views of the shipped
    photos that never calibrate (compressed bundles: quantization is judged on natural images), preprocessed by
    `recipe` (the model's eval preprocessing), else the structured stress images."""
    if natural:
        x, names = natural_inputs(4 * n, imgsz, GOLDEN_SEED, mean, std, recipe=recipe)
        keep = [i for i, nm in enumerate(names) if nm.split(":", 1)[1].split("/")[0] not in calibration_photos()]
        x = x.numpy()[keep[:n]]
    else:
        x = parity_inputs(n, imgsz, seed=GOLDEN_SEED, mean=mean, std=std).numpy()
    m = np.asarray(mean, np.float32).reshape(1, 3, 1, 1)
    s = np.asarray(std, np.float32).reshape(1, 3, 1, 1)
    pixels = np.clip(np.round((x * s + m) * 255.0), 0, 255).astype(np.uint8)
    normalized = normalize_pixels(pixels, mean, std)
    with torch.no_grad():  # in float64, rounded once to float32: the same bytes on any thread count
        # (several outputs, feature maps: side by side per sample, models/features.py pack)
        logits = pack(copy.deepcopy(model).double().eval()(torch.from_numpy(normalized).double())).float().numpy()
    return np.ascontiguousarray(pixels.transpose(0, 2, 3, 1)), logits.astype(np.float32)


def check_bundle_out(out: str | Path, force: bool) -> Path:
    """`--out` of a bundle, checked before any work: a .zip path, not a folder, not there unless `force`."""
    out = Path(out)
    if out.suffix != ".zip":
        raise VitedgeError(f"--out must name a .zip file; got {out}")
    if out.exists() and not force:
        raise VitedgeError(f"{out} exists; pass --force to replace it or choose another --out")
    if out.is_dir():
        raise VitedgeError(f"--out {out} is a folder; give a .zip file path")
    outdir.check_parent(out)
    return out


def build_bundle(out: Path, run_export, hop_name: str, assemble) -> PackageResult:
    """The bundle flow every target's `package` shares: `run_export(folder)` exports into a hidden work folder
    beside `out`; a passed `hop_name` hop goes to `assemble(report, folder)` (which writes the zip); a failed hop,
    or golden vectors the artifact fails, leaves no zip and the export in `out` + '.failed/' (exit 1). All of it
    runs on one thread (targets/threads.py): the bundle's bytes do not follow the process's thread count."""
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.stem}.pkg-", dir=out.parent))
    try:
        with one_thread():
            report = run_export(work / "export")
            hops = [h for h in report.parity if h.hop == hop_name]  # (one per size of a multi-size export)
            if report.exit_code != 0 or not hops or any(h.status != "passed" for h in hops):
                why = f"parity hop {', '.join(h.hop for h in report.failed_hops()) or hop_name} did not pass"
            else:
                try:
                    done = assemble(report, work / "export")
                    done.hop = hop_name
                    return done
                except GoldenMismatch as e:
                    why = str(e)
        failed_dir = out.with_name(out.name + ".failed")
        shutil.rmtree(failed_dir, ignore_errors=True)
        shutil.move(str(work / "export"), failed_dir)
        return PackageResult(None, 1, report, None, failed_dir, why, hop_name)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def finish_bundle(out: Path, report, root: str, files: dict[str, bytes], manifest: dict,
                  golden_check: dict, sizes: list | None = None) -> PackageResult:
    """Complete `manifest` with what every bundle records (parity, its inputs and reference, the golden check,
    versions, the sha256 of every file), add it as ROOT/manifest.json and write the deterministic zip. `sizes`: a
    multi-size bundle's entries (`size_entries`); `golden_check` is then the first size's."""
    if sizes:
        manifest["sizes"] = sizes
    manifest.update({
        "parity": [_hop_entry(h) for h in report.parity],
        "parity_inputs": report.inputs, "compressed_inputs": report.compressed_inputs,
        "parity_reference": _round(_portable_reference(report.reference)),
        "golden": ({"description": "golden/golden.json", "verified": golden_check} if not sizes else
                   {"description": "golden/HxW/golden.json, one folder per size (`sizes`)",
                    "verified": {e["size"]: e["golden"]["verified"] for e in sizes}}),
        "versions": report.versions,
        "files": {k[len(root) + 1:]: _sha256(v) for k, v in sorted(files.items())},
    })
    files[f"{root}/manifest.json"] = _json_bytes(manifest)
    write_deterministic_zip(files, out)
    return PackageResult(out, 0, report, manifest, None)


# ------------------------------------------------------------------------------------------------ several sizes

@dataclass
class BundleSize:
    """One size a bundle carries: its label (HxW; None in a single-size bundle), the function / method serving it
    (None: the artifact's only one), the size as the single-size functions take it, and its golden folder."""
    label: str | None
    entry: str | None
    imgsz: object

    @property
    def golden(self) -> str:
        return "golden" if self.label is None else f"golden/{self.label}"


def bundle_sizes(report) -> list[BundleSize]:
    """The sizes of the export a bundle is made from: one for a single-size export, else each of `report.sizes`."""
    if not report.sizes:
        return [BundleSize(None, None, report.imgsz)]
    return [BundleSize(s["size"], s["entry"], canonical(tuple(s["imgsz"]))) for s in report.sizes]


def size_entries(sizes: list[BundleSize], checks: list[dict], entry_kind: str) -> list | None:
    """The manifest's `sizes` of a multi-size bundle: which function / method (`entry_kind`) serves which size,
    and its golden vectors' check; None for a single-size bundle."""
    if sizes[0].label is None:
        return None
    return [{"size": z.label, "imgsz": [int(v) for v in z.label.split("x")], entry_kind: z.entry,
             "golden": {"file": f"{z.golden}/golden.json", "verified": c}} for z, c in zip(sizes, checks)]


def size_golden(model, z: BundleSize, natural: bool, recipe, what: str, check) -> tuple:
    """(pixels, logits, check) of a size's golden vectors, checked by `check(pixels, logits)` on the packaged
    `what` (model / program); GoldenMismatch where it fails them."""
    pixels, logits = golden_vectors(model, z.imgsz, recipe.mean, recipe.std, natural=natural, recipe=recipe)
    verdict = check(pixels, logits)
    if not verdict["passed"]:
        raise GoldenMismatch(f"the packaged {what} fails its own golden vectors{f' at {z.label}' if z.label else ''}"
                             f": {'; '.join(verdict['problems'])}")
    return pixels, logits, verdict


def add_golden(files: dict, root: str, z: BundleSize, pixels: np.ndarray, logits: np.ndarray, golden: dict,
               entry_kind: str, outputs: list | None = None) -> None:
    """A size's golden vectors and golden.json (naming its function / method, `entry_kind`, in a multi-size
    bundle; each of several `outputs` in its own file) into the bundle's `files`, under ROOT/golden[/HxW]/."""
    if z.entry:
        golden[entry_kind] = z.entry
    outs, several = golden_outputs(outputs, logits, root, z.golden)
    if several:
        golden["outputs"] = several
    files[f"{root}/{z.golden}/inputs.npy"] = _npy_bytes(pixels)
    files.update(outs)
    files[f"{root}/{z.golden}/golden.json"] = _json_bytes(golden)


def sizes_readme(sizes: list[BundleSize], entry_kind: str, how: str) -> str:
    """The README section of a multi-size bundle: the table of sizes and the function / method serving each, and
    `how` an app picks one; "" for a single-size bundle."""
    if sizes[0].label is None:
        return ""
    rows = "\n".join(f"| {z.label.replace('x', ' x ')} | `{z.entry}` | `{z.golden}/` |" for z in sizes)
    return f"""
## Input sizes

This bundle serves {len(sizes)} input sizes (height x width), one {entry_kind} each, with golden vectors per size
(`manifest.json` -> `sizes`). The usage below is written for the first; {how}

| size | {entry_kind} | golden vectors |
|---|---|---|
{rows}
"""


def _columns(outputs: list) -> tuple[tuple[str, slice], ...]:
    """(name, columns) of report.json's `outputs` in a packed row."""
    return column_slices((o["name"], np.prod(o["shape"])) for o in outputs)


def golden_outputs(outputs: list | None, expected: np.ndarray, root: str,
                   folder: str = "golden") -> tuple[dict[str, bytes], object]:
    """The golden output files and their golden.json entry: one output, `FOLDER/outputs.npy` (the logits); several
    (feature maps), `FOLDER/outputs_NAME.npy` each in its own shape (N, C, H, W) with its name and stride."""
    if not outputs or len(outputs) < 2:
        return {f"{root}/{folder}/outputs.npy": _npy_bytes(expected)}, None
    files, entries = {}, []
    for o, (_, cols) in zip(outputs, _columns(outputs)):
        part = np.ascontiguousarray(expected[:, cols].reshape(len(expected), *o["shape"]))
        files[f"{root}/{folder}/outputs_{o['name']}.npy"] = _npy_bytes(part)
        entries.append({"file": f"{folder}/outputs_{o['name']}.npy", "name": o["name"], "dtype": "float32",
                        "shape": list(part.shape), "layout": "NCHW" if part.ndim == 4 else None,
                        "stride": o.get("stride")})
    return files, entries


def outputs_readme(outputs: list | None) -> str:
    """The README's paragraph on several outputs (empty for one)."""
    if not outputs or len(outputs) < 2:
        return ""
    rows = "\n".join(f"| `{o['name']}` | {' x '.join(map(str, o['shape']))} | {o.get('stride') or '-'} |"
                      for o in outputs)
    return ("\n## Outputs\n\nThis model has several outputs (float32, per image; feature maps are NCHW), each with "
            "its own golden file `golden/outputs_NAME.npy` and checked on its own:\n\n| output | shape | stride |\n"
            f"| --- | --- | --- |\n{rows}\n")


def golden_verdict(runner, y: np.ndarray, expected: np.ndarray, tolerance, outputs: list | None = None) -> dict:
    """The golden check's record: `runner`'s outputs `y` on the golden inputs against `expected` by `tolerance`
    (one disagreeing image tolerated, as the compressed hops' resolution bound); several `outputs` (report.json's)
    are checked one by one, each on its own columns."""
    if outputs and len(outputs) > 1:
        parts = {name: golden_verdict(runner, y[:, cols], expected[:, cols], tolerance)
                 for name, cols in _columns(outputs)}
        problems = [f"{k}: {p}" for k, v in parts.items() for p in v["problems"]]
        return {"mode": runner.mode, "backend": runner.backend, "passed": not problems, "problems": problems,
                "outputs": {k: v["metrics"] for k, v in parts.items()}, "samples": int(len(y))}
    metrics = compute_metrics(expected, y)
    problems = resolution_bounds(tolerance, len(y), 0).violations(metrics)
    if not np.isfinite(y).all():
        problems.insert(0, "non-finite outputs")
    return {"mode": runner.mode, "backend": runner.backend, "passed": not problems, "problems": problems,
            "metrics": _round(vars(metrics)), "samples": int(len(y))}
