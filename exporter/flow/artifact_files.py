"""The artifact files `vitedge parity` checks, read before any work: each file's target, ONNX graph and metadata,
the functions / methods of a multi-size one (a multifunction CoreML package, an ExecuTorch program of several
methods), and which sizes the run checks (every size the files hold, or those `--imgsz` picks), each with the
files and entries judged at it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import onnx

from ...errors import VitedgeError
from ...models.input_size import canonical, size_text
from ...targets import row_for_suffix, row_of
from ...targets.graph.metadata import read_metadata
from ..core.settings import ExportSettings
from ..core.target_plans import TargetPlan, load_target, resolve_targets


@dataclass
class ArtifactFile:
    """One artifact file `parity` judges: its target, plan, ONNX graph (.onnx) and metadata; `entries` {function or
    method: [H, W]} where it holds several sizes (a multifunction package, a program of several methods)."""
    path: Path
    tname: str
    graph: onnx.ModelProto | None
    meta: dict
    plan: TargetPlan

    @classmethod
    def read(cls, path: Path, target: str | None, precision: str | None) -> "ArtifactFile":
        return cls.of(path, *read_artifact(path, target), precision)

    @classmethod
    def of(cls, path: Path, tname: str, graph: onnx.ModelProto | None, meta: dict,
           precision: str | None = None) -> "ArtifactFile":
        """The file from what `read_artifact` already read of it (no second read)."""
        if precision is None:
            precision = meta.get("precision") or (onnx_precision(graph) if graph is not None else None)
        return cls(path, tname, graph, meta, resolve_targets(tname, precision)[0])

    @property
    def entries(self) -> dict:
        target = self.plan.target  # None: its module is missing, and so is the metadata (artifact_metadata)
        return target.held_sizes(self.meta) if target is not None else {}


SAME_EXPORT = ("model", "overrides", "checkpoint_sha256", "features", "preprocess")  # what every file shares


def artifact_paths(artifact) -> list[Path]:
    """`artifact` (a path, a list of paths, or None) as a list of paths, each named once."""
    if artifact is None:
        return []
    given = [artifact] if isinstance(artifact, (str, Path)) else list(artifact)
    return list(dict.fromkeys(Path(a) for a in given))


def check_same_export(first: ArtifactFile, other: ArtifactFile) -> None:
    """Several artifact files are judged against one train-form: they must come from the same model and weights."""
    for key in SAME_EXPORT:
        if other.meta.get(key) != first.meta.get(key):
            raise VitedgeError(f"{other.path} and {first.path} were exported with another {key} "
                               f"({other.meta.get(key)!r} vs {first.meta.get(key)!r}): check them in separate "
                               "`vitedge parity` runs")


def sizes_to_check(files: list[ArtifactFile], s: ExportSettings, recorded) -> dict:
    """{size: [(file, entry)]} in order, read before any work: each file at the size it records and each function /
    method of a multi-size file at its own; `--imgsz` picks among them. One file of one size (or a deploy
    checkpoint alone): the size asked, else the one recorded (None: the model's default), as always."""
    if len(files) <= 1 and not (files and files[0].entries):
        return {s.one_size() or canonical(recorded): [(f, None) for f in files]}  # (one_size: one size only)
    jobs = [(f, e, canonical(hw)) for f in files for e, hw in f.entries.items()]
    jobs += [(f, None, canonical(f.meta.get("imgsz"))) for f in files if not f.entries]
    held = list(dict.fromkeys(z for _, _, z in jobs))
    picked = held if s.imgsz is None else s.sizes()
    missing = [z for z in picked if z not in held]
    if missing:
        raise VitedgeError(f"--imgsz {size_text(missing[0])}: the artifacts hold {', '.join(map(size_text, held))}; "
                           "pass one of those, or drop --imgsz to check every size")
    return {z: [(f, e) for f, e, held_at in jobs if held_at == z] for z in picked}


def artifact_target(path: Path, target: str | None) -> str:
    if target:
        return resolve_targets(target)[0].name
    row = row_for_suffix(path.name)  # each row's own suffix first, then the others it recognizes
    if row is None:
        raise VitedgeError(f"cannot tell the target of {path} from its suffix; pass --target")
    return row.name


def read_artifact(path: Path, target: str | None) -> tuple[str, onnx.ModelProto | None, dict]:
    """(target name, the ONNX model for .onnx artifacts, the metadata the artifact carries)."""
    if not path.exists():
        raise VitedgeError(f"artifact {path} not found; check the --artifact path")
    tname = artifact_target(path, target)
    if not row_of(tname).onnx_graph:
        return tname, None, artifact_metadata(tname, path)
    try:
        model = onnx.load(str(path))
    except Exception as e:
        raise VitedgeError(f"{path} is not a readable ONNX file ({type(e).__name__}); re-export it") from None
    if not model.graph.node or not model.graph.output:  # an empty file parses as an empty model: a bad input too
        raise VitedgeError(f"{path} is not a readable ONNX file (it holds no graph); re-export it")
    return tname, model, read_metadata(model)


def artifact_metadata(target: str, path: Path) -> dict:
    """What a target's `read_metadata(path)` says about an artifact it wrote, decoded: JSON strings become values
    and "none" becomes None (CoreML user metadata is all strings)."""
    t, _ = load_target(target)
    if t is None:
        return {}
    try:
        raw = t.read_metadata(path)
    except Exception as e:
        raise VitedgeError(f"cannot read {path} as a {target} artifact ({type(e).__name__}: {e})") from None
    out = {}
    for k, v in raw.items():
        if isinstance(v, str):
            if v.lower() == "none":
                v = None
            else:
                try:
                    v = json.loads(v)
                except json.JSONDecodeError:
                    pass
        out[k] = v
    return out


def onnx_precision(model: onnx.ModelProto) -> str:
    half = any(i.data_type == onnx.TensorProto.FLOAT16 for i in model.graph.initializer)
    return "fp16" if half else "fp32"
