"""One `.mlpackage` for several input sizes: each size's package (converted on its own, with its own attention
order) becomes one function of a multifunction package named for its size (size_224x224, ...), through
coremltools' `MultiFunctionDescriptor` / `save_multifunction`, which stores a weight that every function holds
with the same value once (weights shared). Multifunction packages need iOS 18 / macOS 15 (`MULTIFUNCTION_IOS`).

save_multifunction keeps the functions' descriptions but not the model's metadata: the first size's metadata
(what Xcode shows, what `vitedge parity` reads) is copied onto the merged package, with `functions` ({function:
[H, W]}) added.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from .convert import _no_progress_bars
from .mil_interpreter import package_paths
from .coremltools_import import quiet_coremltools
from .mlpackage import load_program_spec, make_package_deterministic

MULTIFUNCTION_IOS = 18  # the first deployment target with multifunction packages (coremltools: iOS 18 / macOS 15)


def merge_functions(parts: dict[str, Path], sizes: dict[str, list], path: Path) -> dict:
    """The packages `parts` (function name -> a single-function package) merged into the package `path`, the first
    function the default; `sizes`: function name -> [H, W]. Returns what the report says of the functions."""
    with quiet_coremltools():
        import coremltools as ct

        desc = ct.utils.MultiFunctionDescriptor()
        for name, src in parts.items():
            desc.add_function(str(src), "main", name)
        desc.default_function_name = next(iter(parts))
        shutil.rmtree(path, ignore_errors=True)
        with _no_progress_bars():
            ct.utils.save_multifunction(desc, str(path))
    first = load_program_spec(next(iter(parts.values())))
    spec = load_program_spec(path)
    spec.description.metadata.CopyFrom(first.description.metadata)
    spec.description.metadata.userDefined["functions"] = json.dumps(sizes, sort_keys=True)
    spec.description.metadata.userDefined["ios"] = str(MULTIFUNCTION_IOS)
    spec.description.metadata.shortDescription = (f"{first.description.metadata.shortDescription}; one function "
                                                  f"per input size: {', '.join(parts)}")
    spec_file, _ = package_paths(path)
    spec_file.write_bytes(spec.SerializeToString())
    make_package_deterministic(path)
    # what sharing saved: the weights stored once where every function holds the same value
    return {"functions": dict(sizes), "default_function": next(iter(parts)),
            "weight_bytes": _weight_bytes(path), "separate_weight_bytes": sum(map(_weight_bytes, parts.values()))}


def _weight_bytes(package: Path) -> int:
    _, weights = package_paths(package)
    return sum(f.stat().st_size for f in weights.rglob("*") if f.is_file()) if weights is not None else 0


def function_names(package: Path) -> list[str]:
    """The functions of a package (["main"] for a single-function one)."""
    names = [f.name for f in load_program_spec(package).description.functions]
    return names or ["main"]
