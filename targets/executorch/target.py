"""ExecuTorchTarget: lower() exports the deploy-form (`torch.export`, never TorchScript), rewrites it into
XNNPACK-delegable ops (delegable.py, gated in float64; `--executorch-rewrites off` skips them), quantizes it for
int8 (quantize.py), lowers it with the XNNPACK partitioner (or none: `--executorch-backend portable`) and writes
NAME.pte / NAME.int8.pte. The program carries vitedge's metadata (model, preprocessing, labels, precision,
checkpoint hash, ...) as a second method, `vitedge_metadata`, returning the UTF-8 JSON as a uint8 tensor: an app
can read it with the same runtime, and nothing sits beside the file to get lost.

ExecuTorchRunner runs a `.pte` with ExecuTorch's own runtime (`executorch.runtime`, XNNPACK's real kernels):
mode "device".
"""
from __future__ import annotations

import contextlib
import copy
import importlib.metadata
import json
import os
import platform
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from ...errors import VitedgeError
from ...models.outputs import pack_arrays
from ..graph.weights import StoredBias
from ..base import (Artifact, LowerSpec, Runner, StoredWeights, Target, UnavailableError, pad_batch,
                    listed_sizes, reraise_interrupt)
from ..rows import EXECUTORCH_ROW
from .delegable import GATE_RTOL, gate, make_delegable
from ...models.input_size import as_hw

BACKENDS = EXECUTORCH_ROW.option("executorch_backend").choices
METADATA_METHOD = "vitedge_metadata"
INSTALL_HINT = EXECUTORCH_ROW.pip
THREADS_ENV = "VITEDGE_THREADS"


def host_cpu(machine: str | None = None) -> str:
    """This machine's CPU family as a report says it: "x86" or "arm64" (else what the platform names)."""
    m = (machine or platform.machine()).lower()
    return "x86" if m in ("x86_64", "amd64", "i386", "i686", "x86") else "arm64" if m in ("arm64", "aarch64") else m


def executorch_version() -> str | None:
    try:
        return importlib.metadata.version("executorch")
    except importlib.metadata.PackageNotFoundError:
        return None


@contextlib.contextmanager
def quiet_native():
    """Silence what the native libraries print on their first use (cpuinfo's probing of /sys on every start,
    torchao's optional CUDA kernels that a CPU machine cannot load) and torch.export's deprecation warnings:
    none of it is about the user's model. Errors still raise."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            os.dup2(null.fileno(), 2)
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _runtime():
    with quiet_native():
        from executorch.runtime import Runtime

        return Runtime.get()


_DEFAULT_POOL: list[int] = []  # the pool's size before vitedge first resized it: ExecuTorch's own default


def check_program_file(path: str | Path) -> None:
    """VitedgeError (exit 2) unless `path` starts as an ExecuTorch program does: a flatbuffer whose identifier is
    "ET" and two digits, and, where it has one, an extended header ("eh00") whose program fits in the file. Checked
    before the runtime sees the file: its loader aborts the whole process (SIGABRT) on a file with another
    identifier, formatting the bytes it found into an error message that is not UTF-8."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(32)
        size = path.stat().st_size
    except OSError as e:
        raise VitedgeError(f"cannot read {path} ({e.strerror or type(e).__name__}); check the path") from None
    ident = head[4:8]
    if len(head) < 8 or ident[:2] != b"ET" or not ident[2:].isdigit():
        raise VitedgeError(f"{path} is not an ExecuTorch program: no ExecuTorch flatbuffer identifier (ETnn) at "
                           f"bytes 4-8 ({len(head) if len(head) < 8 else size} bytes, found {ident!r}); "
                           "give a .pte written by `vitedge export --target executorch`")
    if head[8:12] == b"eh00" and len(head) >= 24:
        program_size = int.from_bytes(head[16:24], "little")
        if program_size > size:
            raise VitedgeError(f"{path} is truncated: its header says the program is {program_size} bytes, the "
                               f"file has {size}; re-export it")


def set_threads(threads: int) -> None:
    """XNNPACK's thread pool size for the programs loaded after it in this process (the pool is global in
    ExecuTorch; a program keeps the pool it was loaded with: measured, benchmarks/executorch_speed.py)."""
    with quiet_native():  # (the runtime logs every reset)
        from executorch.extension.pybindings import portable_lib

        if not _DEFAULT_POOL:
            _DEFAULT_POOL.append(int(portable_lib._threadpool_get_thread_count()))
        portable_lib._unsafe_reset_threadpool(int(threads))


def default_pool_threads() -> int | None:
    """ExecuTorch's default pool size in this process (None until vitedge first resized the pool)."""
    return _DEFAULT_POOL[0] if _DEFAULT_POOL else None


def outside_delegate(edge_program) -> dict[str, int]:
    """{op: count} of the ops a lowered program runs outside every delegate (ExecuTorch's portable kernels)."""
    left: dict[str, int] = {}
    for n in edge_program.graph_module.graph.nodes:
        if n.op != "call_function" or "executorch_call_delegate" in str(n.target) or "getitem" in str(n.target):
            continue
        name = getattr(n.target, "__name__", str(n.target)).replace("aten.", "")
        left[name] = left.get(name, 0) + 1
    return dict(sorted(left.items()))


def delegate_calls(edge_program) -> int:
    return sum(1 for n in edge_program.graph_module.graph.nodes if "executorch_call_delegate" in str(n.target))


class ExecuTorchRunner(Runner):
    """ExecuTorch's runtime on a `.pte` (its static batch: inputs are run in chunks of it, the last padded)."""
    mode = "device"

    def __init__(self, path: str | Path, threads: int | None = None, method: str | None = None):
        if threads is None and os.environ.get(THREADS_ENV):
            threads = int(os.environ[THREADS_ENV])
        if threads:
            set_threads(threads)
        self.threads = threads
        check_program_file(path)
        with quiet_native():
            self.program = _runtime().load_program(str(path))
            self.method_name = method or "forward"  # a multi-size program: the method of one size
            self.method = self.program.load_method(self.method_name)
        meta = self.method.metadata.input_tensor_meta(0)
        self.batch = int(meta.sizes()[0])
        backend = _program_metadata(self.program).get("executorch_backend", "?")
        self.backend = f"executorch {executorch_version()} ({backend})"

    def run(self, x: np.ndarray) -> np.ndarray:
        out = []
        for i in range(0, len(x), self.batch):
            chunk = np.ascontiguousarray(x[i:i + self.batch], np.float32)
            ys = self.method.execute([torch.from_numpy(pad_batch(chunk, self.batch))])
            # several outputs (feature maps): the method returns each, in order; side by side per sample
            out.append(pack_arrays([y.detach().numpy()[:len(chunk)] for y in ys]))
        return np.concatenate(out).astype(np.float32, copy=False)

    def max_batch(self) -> int | None:
        return self.batch

    def info(self) -> dict:
        # "host": this runtime runs on this machine's CPU, never on a phone, whatever `mode` ("device") says
        return {"runtime": "executorch.runtime", "threads": self.threads or "default", "host": host_cpu(),
                **({"method": self.method_name} if self.method_name != "forward" else {})}

    def close(self) -> None:
        self.method = self.program = None


def read_metadata(path: str | Path) -> dict:
    """The vitedge metadata a `.pte` carries ({} for a program without it)."""
    check_program_file(path)
    return _program_metadata(_runtime().load_program(str(path)))


def _program_metadata(program) -> dict:
    """The vitedge metadata of a loaded program ({} without it)."""
    if METADATA_METHOD not in program.method_names:
        return {}
    raw = program.load_method(METADATA_METHOD).execute([])[0]
    return json.loads(bytes(raw.numpy().astype(np.uint8).tobytes()).decode("utf-8"))


class ExecuTorchTarget(Target):
    row = EXECUTORCH_ROW
    hop_names = {"int8": "executorch-int8"}
    qdq_encoding = None  # int8 is quantized in PT2E from the deploy-form, not from a QDQ graph
    threaded = True      # runner(threads=N): XNNPACK's pool, sized before the program loads
    localization = ("not localized: a .pte exposes only its outputs; the onnx hop of the same deploy-form "
                    "localizes module by module")

    def available(self) -> tuple[bool, str | None]:
        try:
            with quiet_native():
                import executorch.exir  # noqa: F401
                import executorch.runtime  # noqa: F401
        except ImportError as e:
            reraise_interrupt(e)
            return False, f"executorch is not installed ({e}); {INSTALL_HINT}"
        return True, None

    def validate_options(self, options: dict) -> None:
        """Refused before any work without the package (exit 2: the user asked for this target)."""
        ok, why = self.available()
        if not ok:
            raise VitedgeError(f"--target executorch needs the executorch package: {INSTALL_HINT}")
        backend = options.get("executorch_backend")
        if backend is not None and backend not in BACKENDS:
            raise VitedgeError(f"--executorch-backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
        rw = options.get("executorch_rewrites")
        if rw is not None and rw not in ("on", "off"):
            raise VitedgeError(f"--executorch-rewrites must be on or off; got {rw!r}")

    def plan_precision(self, precision: str, options: dict) -> dict:
        if precision == "int8" and options.get("executorch_backend") == "portable":
            raise VitedgeError("--precision int8 for executorch needs the xnnpack backend (ExecuTorch's portable "
                               "kernels have no int8 convolutions): drop --executorch-backend portable")
        return options

    def file_name(self, name: str, precision: str) -> str:
        """NAME.pte, NAME.int8.pte."""
        stem = name if precision == "fp32" else f"{name}.{precision}"
        return f"{stem}{self.suffix}"

    def lower(self, deploy_model: nn.Module, spec: LowerSpec) -> Artifact:
        return self._write({"forward": (deploy_model, spec)},
                           Path(spec.out_dir) / self.file_name(spec.name, spec.precision))

    def lower_sizes(self, parts: dict, path: Path) -> Artifact:
        """One program of one method per size (each exported and rewritten at its size), lowered together:
        ExecuTorch lowers a dict of exported programs into one program, its methods named by the dict's keys."""
        return self._write(parts, Path(path))

    def _write(self, parts: dict, path: Path) -> Artifact:
        """The program of `parts` (method name -> (deploy-form, LowerSpec)) written to `path`; the artifact info
        of a one-method program as it always was, and per method (`methods`) where there are several."""
        ok, why = self.available()
        if not ok:
            raise UnavailableError(why)
        from executorch.exir import to_edge_transform_and_lower

        spec = next(iter(parts.values()))[1]
        backend = spec.options.get("executorch_backend") or "xnnpack"
        info: dict = {"backend": backend, "executorch": executorch_version()}
        with torch.no_grad(), quiet_native():
            programs, per = {}, {}
            for method, (deploy_model, part) in parts.items():
                programs[method], per[method] = _exported(deploy_model, part, backend)
            meta = dict(spec.metadata, precision=spec.precision, executorch_backend=backend)
            if len(parts) > 1:
                meta["methods"] = {m: list(as_hw(part.imgsz)) for m, (_, part) in parts.items()}
            blob = torch.tensor(list(json.dumps(meta, sort_keys=True, default=str).encode()), dtype=torch.uint8)
            partitioners = [_xnnpack_partitioner()] if backend == "xnnpack" else []
            edge = to_edge_transform_and_lower(programs if len(parts) > 1 else programs["forward"],
                                               partitioner=partitioners, constant_methods={METADATA_METHOD: blob})
            for method in parts:
                program = edge.exported_program(method)
                per[method]["outside_delegate"] = outside_delegate(program)
                per[method]["delegate_calls"] = delegate_calls(program)
                per[method]["fully_delegated"] = backend == "xnnpack" and not per[method]["outside_delegate"]
            buffer = edge.to_executorch().buffer
        if len(parts) == 1:
            info.update(next(iter(per.values())))
        else:
            info.update(per[next(iter(per))], methods=per)
        path.write_bytes(buffer)
        return Artifact(self.name, path, spec.precision, info=info)

    def bundle_runner(self, path, entry: str | None = None) -> Runner:
        return ExecuTorchRunner(Path(path), method=entry)

    def read_weights(self, path, entry: str | None = None) -> StoredWeights:
        """A .pte's XNNPACK filters through their per-channel scales (weights.py): unnamed, matched by values (every
        method's: `entry` changes nothing); PT2E's scale floor for the emulation."""
        from .quantize import weight_scale_floor
        from .weights import read_weights

        weights = read_weights(path)
        return StoredWeights({w.name: w.value for w in weights}, named=False, scale_floor=weight_scale_floor(),
                             biases={w.name: StoredBias(w.bias, w.bias_step) for w in weights if w.bias is not None})

    def runner(self, artifact: Artifact, mode: str | None = None, **kw) -> Runner:
        if mode not in (None, "device"):
            raise UnavailableError("an ExecuTorch program runs on ExecuTorch's runtime here: mode 'device' only")
        ok, why = self.available()
        if not ok:
            raise UnavailableError(why)
        runner = ExecuTorchRunner(artifact.path, threads=kw.get("threads"), method=artifact.entry)
        runner.precision = artifact.precision
        return runner

    def held_sizes(self, meta: dict) -> dict:
        """The sizes of a multi-size artifact: {"methods": {entry: [H, W]}} written by `lower_sizes`."""
        return listed_sizes(meta, "methods")

    def read_metadata(self, path: str | Path) -> dict:
        return read_metadata(path)


def _exported(deploy_model: nn.Module, spec: LowerSpec, backend: str) -> tuple[object, dict]:
    """The deploy-form exported at `spec`'s size (rewritten for XNNPACK, quantized for int8), and its record."""
    model = copy.deepcopy(deploy_model).float().eval()
    h, w = as_hw(spec.imgsz)
    example = torch.zeros((spec.batch or 1, len(spec.metadata.get("mean") or (0, 0, 0)), h, w))
    info: dict = {}
    ep = torch.export.export(model, (example,))
    if backend == "xnnpack" and spec.options.get("executorch_rewrites", "on") != "off":
        ep, info["rewrites"] = _rewritten(ep, example)
    if spec.precision == "int8":
        if spec.calibration is None:
            raise ValueError("executorch int8 needs the pipeline's calibration set (spec.calibration)")
        from .quantize import METHOD, quantize_pt2e

        ep = quantize_pt2e(ep, example, spec.calibration)
        info["calibration"] = spec.calibration.record(METHOD)
    return ep, info


def _xnnpack_partitioner():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return XnnpackPartitioner()


def _rewritten(ep, example: torch.Tensor) -> tuple[object, dict]:
    """(the program with the delegable rewrites, their record); the unrewritten program where the float64 gate
    refuses them (a vitedge bug: the record says so and the report shows the ops left outside)."""
    before = ep.module()
    gm, done = make_delegable(copy.deepcopy(before))
    probe = torch.randn(example.shape, generator=torch.Generator().manual_seed(0))
    err = gate(before, gm, probe)
    record = {"applied": done, "float64_rel_err": err, "gate": GATE_RTOL}
    if not err <= GATE_RTOL:
        return ep, {**record, "refused": f"changed the function in float64 ({err:.2e} > {GATE_RTOL:g})"}
    return torch.export.export(gm, (example,)), record
