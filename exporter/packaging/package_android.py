"""`vitedge package --target executorch`: an Android-ready ExecuTorch bundle (.zip) that can check itself.

Built from one `vitedge.export(..., targets="executorch")` run (the full parity ladder, the `.pte` run here by
ExecuTorch's own runtime) and holding, under a top-level folder named after the model:

  NAME.pte / NAME.int8.pte  the ExecuTorch program (XNNPACK delegate), its metadata in method `vitedge_metadata`
  labels.txt                the class labels (with --labels, or a transformers checkpoint's id2label)
  golden/inputs.npy         uint8 RGB pixel images, NHWC
  golden/outputs.npy        float32 logits of the train-form PyTorch model on exactly those pixels (float64)
  golden/golden.json        shapes, the preprocessing recipe, tolerance and how to check
  README.md                 Kotlin usage (org.pytorch.executorch.Module), the Gradle line of the matching runtime
                            (org.pytorch:executorch-android of the exporting ExecuTorch's version), the self-check
  manifest.json             sha256 of every other file, preprocessing, labels, delegation, parity, versions,
                            android_runtime (those Maven coordinates)

The program takes float32 NCHW input normalized by the recipe (an app does the resize, crop and normalization:
the README's Kotlin does it). The golden vectors are checked here by running the `.pte` on them before the zip is
written; the same bytes on every run and thread count (exporter/packaging/bundle.py's deterministic zip, on one thread).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ...errors import VitedgeError
from ...models.input_size import as_hw, size_json
from ...models.preprocess import Recipe
from ...models.registry import recipe_of
from ...targets import get_target
from ...targets.rows import EXECUTORCH_ROW
from ...targets.labels import read_labels
from ..reparam.build_forms import build_train_form
from ..core.settings import ExportSettings
from .bundle import (GOLDEN_SEED, PackageResult, add_golden, build_bundle, bundle_sizes, check_bundle_out,
                     finish_bundle, golden_verdict, normalize_pixels, outputs_readme, size_entries, size_golden, sizes_readme)
from ..verdict.parity import DEFAULT_TOLERANCES, profile_for
from ..flow.pipeline import export

BUNDLE_FORMAT = "vitedge-executorch-bundle/1"
PRECISIONS = EXECUTORCH_ROW.precisions


def golden_tolerance(precision: str):
    """The bundle's self-check bound against the float64 train-form logits: fp32 the fixed fp32 profile (a phone's
    XNNPACK kernels round differently from these, within it), int8 the int8 profile."""
    return DEFAULT_TOLERANCES[profile_for(precision)]


def android_runtime(executorch: str | None) -> dict:
    """The Android runtime that loads the program: ExecuTorch's AAR on Maven Central, `org.pytorch:executorch-android`
    (ExecuTorch's docs/source/using-executorch-android.md), of the release of the `executorch` package that wrote
    it (`executorch`: its version here; a local build suffix such as "+cpu" dropped). Each ExecuTorch release
    publishes the AAR under its own version, so the phone runs the runtime the parity hop ran here."""
    if not executorch:
        raise VitedgeError("the executorch package's version is unknown, so the bundle cannot name the Android "
                           "runtime to match it; pip install 'vitedge[executorch]'")
    version = executorch.split("+")[0]
    return {"maven": f"org.pytorch:executorch-android:{version}", "version": version,
            "gradle": f'implementation("org.pytorch:executorch-android:{version}")'}


def check_golden(pte: Path, pixels_nhwc: np.ndarray, expected: np.ndarray, recipe: Recipe, tolerance,
                 method: str | None = None, outputs: list | None = None) -> dict:
    """Run the golden pixels, normalized by `recipe`, through the `.pte` here (its `method`, in a multi-size
    program); metrics and verdict (each of several `outputs` on its own)."""
    x = normalize_pixels(pixels_nhwc.transpose(0, 3, 1, 2), recipe.mean, recipe.std)
    with get_target(EXECUTORCH_ROW.name).bundle_runner(pte, **({"entry": method} if method else {})) as runner:
        y = runner.run(x)
    return golden_verdict(runner, y, expected, tolerance, outputs)


def _readme(name: str, pte: str, imgsz: int, recipe: Recipe, classes: int, labelled: bool, weights: str,
            precision: str, golden: dict, runtime: dict) -> str:
    dims = " x ".join(map(str, as_hw(imgsz)))  # height x width
    demo = ("\n> **Demo weights.** Packaged without `--checkpoint`: seeded random (trained-like) weights. Predictions "
            "are meaningless; use it to wire up the app, then package a real checkpoint.\n"
            if weights == "untrained" else "")
    tol = golden["tolerance"]
    mean = ", ".join(f"{v:.4f}f" for v in recipe.mean)
    std = ", ".join(f"{v:.4f}f" for v in recipe.std)
    label_line = ('val labels = assets.open("labels.txt").bufferedReader().readLines()\n'
                  'println(labels[best])\n' if labelled else "")
    return f"""# {name} for ExecuTorch ({precision}, Android and iOS)
{demo}
`{pte}` is an ExecuTorch program lowered by vitedge from the re-parameterized deploy-form of `{name}` through
`torch.export`, delegated to XNNPACK, and checked against the original PyTorch model by running it with
ExecuTorch's runtime (see `manifest.json` -> `parity` and `delegation`).

- **Input**: float32, 1 x 3 x {dims} (NCHW), RGB, made as at evaluation: {recipe.describe(imgsz)};
  then `(pixel / 255 - mean) / std` with mean ({", ".join(f"{v:g}" for v in recipe.mean)}) and std
  ({", ".join(f"{v:g}" for v in recipe.std)}).
- **Output**: float32 logits, 1 x {classes}.

## Kotlin (Android, `{runtime["maven"]}`)

The program was written and checked by ExecuTorch {runtime["version"]}: use its Android runtime, the same release
(`manifest.json` -> `android_runtime`), from Maven Central, in your app module's `build.gradle.kts`:

```kotlin
dependencies {{
    {runtime["gradle"]}
}}
```

```kotlin
import org.pytorch.executorch.EValue
import org.pytorch.executorch.Module
import org.pytorch.executorch.Tensor

val module = Module.load(File(filesDir, "{pte}").absolutePath)  // copy it out of assets first
// bitmap: the photo resized and centre-cropped to {imgsz} x {imgsz} as above
val mean = floatArrayOf({mean}); val std = floatArrayOf({std})
val px = IntArray({imgsz} * {imgsz}); bitmap.getPixels(px, 0, {imgsz}, 0, 0, {imgsz}, {imgsz})
val data = FloatArray(3 * {imgsz} * {imgsz})
for (i in px.indices) for (c in 0 until 3) {{
    val v = ((px[i] shr (16 - 8 * c)) and 0xFF) / 255f                     // R, G, B
    data[c * {imgsz} * {imgsz} + i] = (v - mean[c]) / std[c]
}}
val input = Tensor.fromBlob(data, longArrayOf(1, 3, {imgsz}.toLong(), {imgsz}.toLong()))
val logits = module.forward(EValue.from(input))[0].toTensor().dataAsFloatArray
val best = logits.indices.maxByOrNull {{ logits[it] }}!!
{label_line}```

The program also answers `module.execute("vitedge_metadata")`: a uint8 tensor holding this model's metadata as
UTF-8 JSON (model, preprocessing, labels, precision).

## Self-check on a device

`golden/inputs.npy` holds {golden['inputs']['shape'][0]} images (uint8, N x {dims} x 3, RGB, already
{imgsz} x {imgsz}: no resize or crop) and `golden/outputs.npy` the PyTorch model's logits for them (float32,
N x {classes}). Normalize each image as above, run it, and compare with the expected row: over all N,
{", ".join(f"{k} {v}" for k, v in tol.items() if k not in ("name",))}, top-1 class equal. `golden/golden.json`
says the same in machine form. Integrity: `manifest.json` lists the sha256 of every file in this bundle.
"""


def package_executorch(model=None, out: str | Path | None = None, *, progress=None,
                       executorch_rewrites: str | None = None, **settings) -> PackageResult:
    """Build the Android bundle at `out` (a .zip): as `package.package` (the same settings), for the executorch
    target (`executorch_rewrites`: export's --executorch-rewrites, default on)."""
    s = ExportSettings.build(model, settings, "package_executorch").replace(targets="executorch")
    if executorch_rewrites is not None:
        s = s.replace(options={"executorch_rewrites": executorch_rewrites})
    s = s.replace(precision=s.precision or "fp32")
    out = check_bundle_out(out, s.force)
    if s.precision not in PRECISIONS:
        raise VitedgeError(f"vitedge package --target executorch --precision must be fp32 or int8; got {s.precision!r}")
    if s.labels is not None:
        read_labels(s.labels)
    hop_name = get_target("executorch").hop_name(s.precision)

    def run(export_dir: Path):  # (force: the bundle's; the export folder is a fresh one of its own)
        return export(s.replace(out=export_dir, force=False), progress=progress)

    return build_bundle(out, run, hop_name, lambda report, export_dir: _assemble(report, export_dir, out, hop_name,
                                                                                 s))


def _assemble(report, export_dir: Path, out: Path, hop_name: str, s: ExportSettings) -> PackageResult:
    name, labels, precision = report.model, s.labels, s.precision
    entry = report.artifacts[hop_name]
    pte = export_dir / entry.path
    loaded = build_train_form(name, s.checkpoint, s.overrides, s.seed, preprocess=s.preprocess, features=s.features)
    labels = labels if labels is not None else loaded.labels
    recipe = recipe_of(loaded.model)
    compressed = precision != "fp32"
    tol = golden_tolerance(precision)
    root = name
    files = {f"{root}/{pte.name}": pte.read_bytes()}
    label_list = read_labels(labels) if labels is not None else None
    if label_list:
        files[f"{root}/labels.txt"] = ("\n".join(label_list) + "\n").encode()
    tol_d = {k: v for k, v in vars(tol).items() if v is not None}
    sizes, checks, goldens = bundle_sizes(report), [], []
    for z in sizes:  # golden vectors per size, each checked on its own method
        pixels, logits, golden_check = size_golden(
            loaded.sized(z.imgsz), z, compressed, recipe, "program",
            lambda px, expected: check_golden(pte, px, expected, recipe, tol, z.entry, report.outputs))
        golden = {
            "inputs": {"file": f"{z.golden}/inputs.npy", "dtype": "uint8", "shape": list(pixels.shape),
                       "layout": "NHWC", "color": "RGB", "range": [0, 255],
                       "source": ("views of the shipped photos that never calibrate, quantized to 8-bit pixels"
                                  if compressed else f"vitedge.exporter.verdict.inputs.parity_inputs(n={len(pixels)}, "
                                  f"seed={GOLDEN_SEED}) quantized to 8-bit pixels")},
            "outputs": {"file": f"{z.golden}/outputs.npy", "dtype": "float32", "shape": list(logits.shape),
                        "name": "logits",
                        "source": "train-form PyTorch model (float64, rounded once) on the same pixels, normalized"},
            "program_input": {"dtype": "float32", "layout": "NCHW", "normalize": "(pixel / 255 - mean) / std",
                              "mean": list(recipe.mean), "std": list(recipe.std)},
            "preprocess": report.preprocess,
            "tolerance": tol_d,
            "check": "over all images: lowest cosine, max relative error / PSNR and top-1 agreement must meet "
                     "`tolerance`",
            "verified": golden_check,
        }
        add_golden(files, root, z, pixels, logits, golden, "method", report.outputs)
        checks.append(golden_check)
        goldens.append(golden)
    golden = goldens[0]
    info = entry.info
    runtime = android_runtime(info.get("executorch"))
    readme = _readme(name, pte.name, report.imgsz, recipe, int(logits.shape[1]), label_list is not None,
                     report.weights, precision, golden, runtime)
    readme += sizes_readme(sizes, "method", "run another size's method by its name, `module.execute(\"size_HxW\", "
                                            "input)`, with an input of that size.")
    files[f"{root}/README.md"] = (readme + outputs_readme(report.outputs)).encode()
    manifest = {
        "format": BUNDLE_FORMAT, "model": name, "imgsz": size_json(report.imgsz),
        "input_size": list(as_hw(report.imgsz)), "overrides": report.overrides,
        "weights": report.weights, "checkpoint_sha256": report.checkpoint_sha256,
        "program": pte.name, "precision": precision, "android_runtime": runtime,
        "delegation": {"backend": info.get("backend"), "fully_delegated": info.get("fully_delegated"),
                       "outside_delegate": info.get("outside_delegate"), "delegate_calls": info.get("delegate_calls"),
                       "rewrites": (info.get("rewrites") or {}).get("applied")},
        "calibration": report.calibration,
        "preprocess": report.preprocess, "from_checkpoint": report.from_checkpoint,
        "labels": {"file": "labels.txt", "count": len(label_list)} if label_list else None,
        "outputs": report.outputs,
    }
    return finish_bundle(out, report, root, files, manifest, checks[0], size_entries(sizes, checks, "method"))
