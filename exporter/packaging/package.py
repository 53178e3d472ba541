"""`vitedge package`: an app-ready CoreML bundle (.zip) that can check itself.

The bundle is built from one `vitedge.export(..., targets="coreml", input="image")` run (the full parity ladder,
CoreML hop included) and holds, under a top-level folder named after the model:

  NAME.mlpackage        image input (RGB pixels 0-255, normalization inside), classifier when --labels is given
  labels.txt            the class labels (with --labels)
  golden/inputs.npy     uint8 RGB pixel images, NHWC (the structured parity images, quantized to 8 bits)
  golden/outputs.npy    float32 logits of the train-form PyTorch model on exactly those pixels (computed in float64)
  golden/golden.json    shapes, layouts, preprocessing, tolerance and how to check
  README.md             Swift usage (Core ML and Vision) and the self-check
  manifest.json         sha256 of every other file, input spec, preprocessing, labels, parity results, versions

With `--precision w8|palette4|palette6|w8a8` the .mlpackage is compressed (targets/coreml/compress.py), its hop is
judged by the kind's profile on natural images, the golden vectors are natural photos that did not calibrate it,
and manifest.json records the compression (`compression`: kind, coremltools call, ops, sizes, what stayed float,
calibration) beside the parity results.

Deterministic: the same inputs give a byte-identical zip on any thread count (sorted entries, fixed timestamps and
permissions, no wall-clock or temporary paths in any file, the .mlpackage's Manifest.json identifiers derived from
its contents, every computation on one thread: bundle.build_bundle).
"""
from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import numpy as np

from ...errors import VitedgeError
from ...precisions import TABLE
from ...models.input_size import as_hw, size_json
from ...models.preprocess import Recipe
from ...models.registry import recipe_of
from ...targets import get_target, rows
from . import bundles
from ...targets.labels import read_labels
from ...targets.rows import COREML_ROW
from .bundle import (GOLDEN_SAMPLES, GOLDEN_SEED, METRIC_DIGITS, ZIP_DATE, GoldenMismatch, PackageResult,  # noqa: F401
                     _json_bytes, _npy_bytes, _tree_files, add_golden, build_bundle, bundle_sizes, check_bundle_out, size_golden,
                     finish_bundle, golden_outputs, golden_vectors, golden_verdict, outputs_readme, size_entries, sizes_readme,
                     write_deterministic_zip)
from ..reparam.build_forms import build_train_form
from ..core.settings import ExportSettings
from ..verdict.parity import profile_for, tolerances as make_tolerances
from ..flow.pipeline import export

BUNDLE_FORMAT = "vitedge-coreml-bundle/1"
KINDS = tuple(p for p in COREML_ROW.precisions if TABLE[p].compressed)  # the compressed kinds a package can hold


# ------------------------------------------------------------------------------------------------ small helpers


def _compression_entry(info: dict | None) -> dict | None:
    """What the manifest says about a compressed package: the kind, the coremltools call, the ops it wrote, what
    stayed float (count), the sizes."""
    if not info:
        return None
    return {"kind": info["kind"], "ios": info["ios"], "api": info["api"], "coremltools": info["coremltools"],
            "compression_ops": info["compression_ops"], "weights_compressed": info["weights_compressed"],
            "weights_kept_float": len(info["weights_kept_float"]), "bytes": info["bytes"],
            "lut_group_sizes": info.get("lut_group_sizes")}


# ------------------------------------------------------------------------------------------------ golden vectors


def check_golden(mlpackage: Path, pixels_nhwc: np.ndarray, expected: np.ndarray, tolerance,
                 function: str | None = None, outputs: list | None = None) -> dict:
    """Run the golden pixels through the emulated CoreML hop (of `function`, in a multi-size package); metrics and
    verdict against `tolerance` (each of several `outputs` on its own)."""
    with get_target(COREML_ROW.name).bundle_runner(mlpackage, **({"entry": function} if function else {})) as runner:
        y = runner.run(pixels_nhwc.transpose(0, 3, 1, 2).astype(np.float32))
    return golden_verdict(runner, y, expected, tolerance, outputs)


# ------------------------------------------------------------------------------------------------ README

def _compression_line(precision: str) -> str:
    what = TABLE[precision].stored  # the precision row's wording ("" for a float precision)
    if not what:
        return ""
    return (f"\n- Compressed: {what} (`manifest.json` -> `compression`; its parity on natural images -> `parity`, "
            "and the golden vectors' tolerance is that profile's).")


def _readme(name: str, imgsz, classifier: bool, weights: str, ios: int, precision: str, golden: dict) -> str:
    dims, (h, w) = " x ".join(map(str, as_hw(imgsz))), as_hw(imgsz)  # height x width
    demo = ("\n> **Demo weights.** This bundle was packaged without `--checkpoint`: the model has seeded random "
            "(trained-like) weights. Its predictions are meaningless; use it to wire up the app, then package a "
            "real checkpoint.\n" if weights == "untrained" else "")
    cls_swift = ('let label = out.featureValue(for: "classLabel")!.stringValue            // most likely class\n'
                 'let probs = out.featureValue(for: "classLabel_probs")!.dictionaryValue  // label -> probability\n'
                 if classifier else "")
    vision = ("""
### With Vision (crop and scale handled for you)

```swift
import Vision

let vnModel = try VNCoreMLModel(for: model)
let request = VNCoreMLRequest(model: vnModel) { request, _ in
    if let best = (request.results as? [VNClassificationObservation])?.first {
        print(best.identifier, best.confidence)
    }
}
request.imageCropAndScaleOption = .centerCrop
try VNImageRequestHandler(cgImage: cgImage).perform([request])
```
""" if classifier else "")
    tol = golden["tolerance"]
    return f"""# {name} for Core ML ({precision}, iOS {ios}+)
{demo}
`{name}.mlpackage` is an ML Program converted by vitedge from the re-parameterized deploy-form of `{name}` and
checked against the original PyTorch model (see `manifest.json` -> `parity`).

- **Input** `image`: RGB pixels 0-255, made as at evaluation: {Recipe.from_dict(golden["preprocess"]).describe(imgsz)}.
  Normalization (mean {golden["preprocess"]["mean"]}, std {golden["preprocess"]["std"]}) is inside the model.
- **Outputs**: `logits` (float32, 1 x classes){', `classLabel` (String) and `classLabel_probs` ([String: Double])' if classifier else ''}.
- Static shape, fp16 compute with fp32 islands for normalizations (`manifest.json` -> `precision_policy`), so the
  Neural Engine can run it.{_compression_line(precision)}

## Swift

Drag `{name}.mlpackage` into Xcode (it generates a `{name}` class), or load it at run time:

```swift
import CoreML

let config = MLModelConfiguration()
config.computeUnits = .cpuAndNeuralEngine
let url = Bundle.main.url(forResource: "{name}", withExtension: "mlmodelc")!   // Xcode compiles .mlpackage
let model = try MLModel(contentsOf: url, configuration: config)

// pixelBuffer: a {w}x{h} (width x height) kCVPixelFormatType_32BGRA or 32ARGB CVPixelBuffer of the (center-cropped) photo
let input = try MLDictionaryFeatureProvider(dictionary: ["image": MLFeatureValue(pixelBuffer: pixelBuffer)])
let out = try model.prediction(from: input)
let logits = out.featureValue(for: "logits")!.multiArrayValue!
{cls_swift}```
{vision}
## Self-check on a device

`golden/inputs.npy` holds {golden['inputs']['shape'][0]} images (uint8, N x {dims} x 3, RGB) and
`golden/outputs.npy` the PyTorch model's logits for them (float32, N x classes). Feed each image as above and
compare your `logits` with the expected row: cosine similarity >= {tol.get('cosine')}, PSNR >= {tol.get('psnr_db')} dB
(20 log10(max|expected| / RMSE) over all N), top-1 class equal. `golden/golden.json` says the same in machine form.
A `.npy` file is a small text header followed by the raw little-endian array:

```swift
func loadNpy(_ url: URL) throws -> Data {{
    let data = try Data(contentsOf: url)
    let headerLen = Int(data[8]) | (Int(data[9]) << 8)   // format version 1.0
    return data.subdata(in: (10 + headerLen)..<data.count)  // uint8 pixels or float32 logits, C order
}}
```

Integrity: `manifest.json` lists the sha256 of every file in this bundle.
"""


# ------------------------------------------------------------------------------------------------ package

# the settings a package reads (the rest shape the export it runs itself, and are refused rather than ignored)
PACKAGE_SETTINGS = ("model", "targets", "checkpoint", "labels", "imgsz", "precision", "samples", "overrides",
                    "tolerances", "force", "seed", "calib", "calib_images", "images", "exporter", "preprocess",
                    "features")


def package(model=None, out: str | Path | None = None, *, ios: int | str | None = None,
            executorch_rewrites: str | None = None, progress=None, **settings) -> PackageResult:
    """Build BUNDLE.zip at `out`: `vitedge package`. `model` is an ExportSettings (exporter/core/settings.py) or
    the model, with the settings a package reads as keywords (PACKAGE_SETTINGS: target, checkpoint, labels, imgsz,
    precision, samples, overrides, tolerances, force, seed, calib, calib_images, images, exporter, preprocess), as
    for `export`; `force` replaces an existing `out`.

    Returns the PackageResult (`path`, `exit_code`, the export `report`, the `manifest`). Raises VitedgeError on bad
    input (nothing written); a failed parity hop gives exit_code 1, no zip, and the export folder kept at `out` +
    '.failed/' for inspection. `ios` None: 16, or what the precision needs (w8a8: 17, recorded in the manifest).
    `labels` (class names in index order) make the model a classifier; `images`, `preprocess` and `model` None are
    as for `export`. `exporter`: the ONNX exporter of the ladder's base graph (the CoreML package itself is
    converted from the deploy-form). `target`: the target whose bundle is built (its row's `bundle`: coreml, the
    default, for iOS; executorch for Android, exporter/packaging/package_android.py). `ios` and
    `executorch_rewrites` are the bundle's own target options (as export's --ios / --executorch-rewrites), refused
    for a bundle whose maker does not take them."""
    s = ExportSettings.build(model, settings, "package")
    s.only(PACKAGE_SETTINGS, "package")
    if out is None:
        raise VitedgeError("vitedge package needs --out BUNDLE.zip (the bundle to write)")
    makers = bundles()
    target = s.targets or "coreml"
    if target not in makers:
        raise VitedgeError(f"vitedge package --target must be {' or '.join(makers)}; got {target!r}")
    s = s.replace(targets=target, precision=s.precision or get_target(target).default_precision)
    module, func = makers[target].split(":")
    maker = getattr(importlib.import_module(module), func)  # the target's bundle, in its own module
    given = {k: v for k, v in {"ios": ios, "executorch_rewrites": executorch_rewrites}.items() if v is not None}
    for key in given:  # a target option of another target's bundle: before any work
        if key not in inspect.signature(maker).parameters:
            owner = next((r.name for r in rows() if any(o.key == key for o in r.options)), "another")
            raise VitedgeError(f"--{key.replace('_', '-')} applies to --target {owner} only; drop it for the "
                               f"{target} bundle")
    return maker(s, out, progress=progress, **given)


def package_coreml(s: ExportSettings, out, *, progress=None, ios=None) -> PackageResult:
    """Build the iOS bundle at `out` (a .zip): as `package`, for the coreml target (see the module doc)."""
    out = check_bundle_out(out, s.force)
    if ios is not None:
        get_target(COREML_ROW.name).validate_options({"ios": ios})  # --ios before any work
    if s.precision not in ("fp16",) + KINDS:
        raise VitedgeError(f"vitedge package --precision must be one of fp16, {', '.join(KINDS)}; got {s.precision!r}")
    if s.labels is not None:
        read_labels(s.labels)  # the file's problems before any work (its count is checked against the model later)
    tol = make_tolerances(s.tolerances)[profile_for(s.precision)]

    def run(export_dir: Path):  # (force: the bundle's; the export folder is a fresh one of its own)
        return export(s.replace(out=export_dir, force=False, options={"input": "image", "ios": ios}),
                      progress=progress)

    return build_bundle(out, run, "coreml", lambda report, export_dir: _assemble(report, export_dir, out, s, tol))


def _assemble(report, export_dir: Path, out: Path, s: ExportSettings, tol) -> PackageResult:
    name, labels, precision = report.model, s.labels, s.precision
    entry = report.artifacts["coreml"]
    mlpackage = export_dir / entry.path
    ios = int(entry.info["ios"])
    compressed = precision in KINDS
    loaded = build_train_form(name, s.checkpoint, s.overrides, s.seed, preprocess=s.preprocess, features=s.features)
    labels = labels if labels is not None else loaded.labels  # (a transformers checkpoint's id2label)
    root = name
    files: dict[str, bytes] = _tree_files(mlpackage, f"{root}/{mlpackage.name}")
    label_list = read_labels(labels) if labels is not None else None
    if label_list:
        files[f"{root}/labels.txt"] = ("\n".join(label_list) + "\n").encode()
    info = entry.info
    tol_d = {k: v for k, v in vars(tol).items() if v is not None}
    sizes, checks, goldens = bundle_sizes(report), [], []
    for z in sizes:  # golden vectors per size, each checked on its own function
        pixels, logits, golden_check = size_golden(  # the export's own recipe (report.preprocess)
            loaded.sized(z.imgsz), z, compressed, recipe_of(loaded.model), "model",
            lambda px, expected: check_golden(mlpackage, px, expected, tol, z.entry, report.outputs))
        golden = {
            "inputs": {"file": f"{z.golden}/inputs.npy", "dtype": "uint8", "shape": list(pixels.shape),
                       "layout": "NHWC", "color": "RGB", "range": [0, 255],
                       "source": (f"views of the shipped photos that never calibrate (vitedge.exporter.verdict.inputs."
                                  f"natural_inputs, seed={GOLDEN_SEED}) quantized to 8-bit pixels" if compressed else
                                  f"vitedge.exporter.verdict.inputs.parity_inputs(n={len(pixels)}, seed={GOLDEN_SEED}) "
                                  "quantized to 8-bit pixels (noise, gradient, checker, smooth, blocks, extreme; cycled)")},
            "outputs": {"file": f"{z.golden}/outputs.npy", "dtype": "float32", "shape": list(logits.shape),
                        "name": "logits",
                        "source": "train-form PyTorch model (float32) on the same pixels, normalized with mean/std"},
            "preprocessing": info.get("function_info", {}).get(z.entry, info)["input_spec"],
            "preprocess": report.preprocess,
            "tolerance": tol_d,
            "check": "per image: feed the pixels to `image`, compare `logits` with the expected row; over all images: "
                     "lowest cosine, PSNR = 20*log10(max|expected|/RMSE) and top-1 agreement must meet `tolerance`",
            "verified": golden_check,
        }
        add_golden(files, root, z, pixels, logits, golden, "function", report.outputs)
        checks.append(golden_check)
        goldens.append(golden)
    readme = _readme(name, report.imgsz, label_list is not None, report.weights, ios, precision, goldens[0])
    readme += sizes_readme(sizes, "function", "load another size's function with `config.functionName = "
                                              "\"size_HxW\"` (MLModelConfiguration, iOS 18+) before `MLModel(contentsOf:"
                                              "configuration:)`, and feed it pixels of that size.")
    files[f"{root}/README.md"] = (readme + outputs_readme(report.outputs)).encode()
    manifest = {
        "format": BUNDLE_FORMAT,
        "model": name, "imgsz": size_json(report.imgsz),
        "input_size": list(as_hw(report.imgsz)), "overrides": report.overrides,
        "weights": report.weights,
        "weights_note": ("untrained: seeded trained-like demo weights, predictions are meaningless"
                         if report.weights == "untrained" else "checkpoint"),
        "checkpoint_sha256": report.checkpoint_sha256,
        "mlpackage": f"{mlpackage.name}", "precision": precision, "ios": ios,
        "ios_raised": entry.info.get("ios_raised"),
        "compression": _compression_entry(entry.info.get("compression")),
        "calibration": report.calibration,
        "input": info["input_spec"],
        "preprocess": report.preprocess, "from_checkpoint": report.from_checkpoint,
        "outputs": info["outputs"], "model_outputs": report.outputs,
        "labels": {"file": "labels.txt", "count": len(label_list)} if label_list else None,
        "precision_policy": {"rules": [r["name"] for r in (info.get("precision_policy") or {}).get("rules", [])],
                             "fp32_islands": info.get("fp32_islands")},
        "reparam": {"folded": report.reparam.folded, "unfolded": report.reparam.unfolded,
                    "attention_order": report.reparam.attention_order},
        "onnx_exporter": {"exporter": report.exporter, "exporter_fallback": report.exporter_fallback},
    }
    return finish_bundle(out, report, root, files, manifest, checks[0], size_entries(sizes, checks, "function"))
