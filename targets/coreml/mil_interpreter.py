"""Execute a saved `.mlpackage`'s ML Program with numpy: the emulated CoreML hop on machines without CoreML.

The package is read the way CoreML reads it: `Manifest.json` (through coremltools' libmodelpackage) names the root
`model.mlmodel` and the `weights/` folder; the protobuf's `mlProgram.functions["main"]` lists the ops in order;
`const` values come from the protobuf or from `weight.bin` through coremltools' blob reader (`libmilstoragepython`,
via the MIL proto loader's `_load_value`, which honours each value's dtype).

fp16 semantics (documented in the README): numpy's float16 arithmetic is ~200x slower than float32, so every op is
computed in float32 on its (already fp16-exact) inputs and weights, and each output is rounded to the dtype the
program declares for it: an fp16 output is rounded to float16, overflowing to inf exactly where an fp16 value
would (|x| >= 65520). The sum of squares inside `reduce_l2_norm`/`reduce_sum_square`/`l2_norm` is rounded too,
because in an fp16 op that named intermediate is fp16. An op the kernels in `mil_ops.py` do not know raises
`UnsupportedOpError` naming it.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import VitedgeError
from ..base import UnavailableError
from .coremltools_import import quiet_coremltools
from . import mil_ops_compressed  # noqa: F401  (registers the compressed programs' kernels in OPS)
from .fp16_cast import round_fp16
from .mil_ops import OPS, OpArgs

_DTYPES = {"FLOAT16": "fp16", "FLOAT32": "fp32", "FLOAT64": "fp64", "BFLOAT16": "bf16", "INT8": "int8",
           "INT16": "int16", "INT32": "int32", "INT64": "int64", "UINT8": "uint8", "UINT16": "uint16",
           "UINT32": "uint32", "BOOL": "bool", "STRING": "string"}
_NP = {"fp32": np.float32, "fp64": np.float64, "int8": np.int8, "int16": np.int16, "int32": np.int32,
       "int64": np.int64, "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32, "bool": np.bool_}
_TUPLE_PARAMS = {"values"}  # concat/stack/einsum take a tuple even when it holds one tensor


class UnsupportedOpError(UnavailableError):
    """The program uses an op the emulator has no kernel for (the hop cannot run here: 'unverified')."""


class MILProgramError(VitedgeError):
    """The package cannot be read as an ML Program."""


_BLAS: list = []  # [ctypes lib or None], looked up once


def _openblas():
    """numpy's bundled OpenBLAS (None elsewhere, e.g. Accelerate on macOS)."""
    if not _BLAS:
        lib = None
        try:
            import ctypes
            libs = Path(np.__file__).resolve().parent.parent / "numpy.libs"
            for so in sorted(libs.glob("*openblas*.so*")):
                cand = ctypes.CDLL(str(so))
                if hasattr(cand, "openblas_set_num_threads_local"):
                    lib = cand
                    break
        except OSError:
            lib = None
        _BLAS.append(lib)
    return _BLAS[0]


@contextlib.contextmanager
def single_threaded_blas():
    """Run numpy's GEMMs on this thread only: the emulator's many small GEMMs are 10-70x slower when OpenBLAS
    spins up threads on a busy 2-core machine (measured), and one thread makes timings predictable."""
    lib = _openblas()
    if lib is None:
        yield
        return
    prev = lib.openblas_set_num_threads_local(1)
    try:
        yield
    finally:
        lib.openblas_set_num_threads_local(prev)


def as_declared(value, dtype: str):
    """Store an op output in the dtype the program declares (floats live as float32 arrays)."""
    if dtype == "fp16":
        return round_fp16(value)
    if dtype in _NP:
        with np.errstate(invalid="ignore", over="ignore"):
            return np.asarray(value).astype(_NP[dtype])
    return value


def _type_name(vtype) -> str:
    kind = vtype.WhichOneof("type")
    if kind == "tensorType":
        from coremltools.proto import MIL_pb2
        return _DTYPES.get(MIL_pb2.DataType.Name(vtype.tensorType.dataType), "unknown")
    return {"dictionaryType": "dict", "listType": "list", "stateType": "state"}.get(kind, kind or "unknown")


def _shape(vtype) -> tuple | None:
    if vtype.WhichOneof("type") != "tensorType":
        return None
    dims = vtype.tensorType.dimensions
    if any(d.WhichOneof("dimension") != "constant" for d in dims):
        return None
    return tuple(int(d.constant.size) for d in dims)


@dataclass
class Op:
    type: str
    name: str
    inputs: dict            # param -> ("var", name) | ("val", value) | list of those
    outputs: list           # [(var name, dtype)]


@dataclass
class MILProgram:
    path: Path
    opset: str
    inputs: dict            # name -> (dtype, shape)
    outputs: list           # block output names, in order
    ops: list               # [Op] excluding consts
    consts: dict            # var name -> value
    const_dtypes: dict      # var name -> dtype
    spec: object = field(repr=False, default=None)  # the Model protobuf (description, metadata)
    function: str = "main"  # which function of the package this is

    @property
    def description(self):
        """This function's description (inputs, outputs): a multifunction package's own, else the model's."""
        return next((f for f in self.spec.description.functions if f.name == self.function), self.spec.description)

    # -------------------------------------------------------------------------------------- introspection
    def op_counts(self) -> Counter:
        return Counter(o.type for o in self.ops)

    def dtype_counts(self) -> dict:
        """{op type: {output dtype: count}}: where the program computes in fp16 and where in fp32."""
        out: dict = {}
        for o in self.ops:
            dt = o.outputs[0][1] if o.outputs else "none"
            out.setdefault(o.type, Counter())[dt] += 1
        return {k: dict(v) for k, v in sorted(out.items())}

    def unknown_ops(self) -> list[str]:
        return sorted({o.type for o in self.ops if o.type not in OPS})

    @property
    def input_kind(self) -> str:
        """'image' or 'tensor' (the model description's first input)."""
        if self.spec is not None and self.description.input:
            return "image" if self.description.input[0].type.WhichOneof("Type") == "imageType" else "tensor"
        return "tensor"

    # -------------------------------------------------------------------------------------- execution
    def run(self, feeds: dict, keep: bool = False) -> dict:
        """Execute the main function. `feeds`: input name -> array (cast to the declared input dtype).
        Returns {output name: value}; with `keep`, every intermediate value too."""
        missing = [n for n in self.inputs if n not in feeds]
        if missing:
            raise ValueError(f"missing program inputs {missing}; the program takes {list(self.inputs)}")
        env = dict(self.consts)
        for name, (dtype, shape) in self.inputs.items():
            x = np.asarray(feeds[name])
            if shape is not None and tuple(x.shape) != shape:
                raise ValueError(f"input {name!r} has shape {tuple(x.shape)}, the program expects {shape}")
            env[name] = as_declared(x, dtype)
        with single_threaded_blas():
            self._execute(env, free=not keep)
        if keep:
            return env
        return {n: env[n] for n in self.outputs}

    def _last_uses(self) -> list[list[str]]:
        """Per op: the non-const variables nothing later reads (freed right after it: peak memory stays small)."""
        keep = set(self.outputs) | set(self.consts)
        last: dict = {}
        for i, o in enumerate(self.ops):
            for b in o.inputs.values():
                for kind, v in (b if isinstance(b, list) else [b]):
                    if kind == "var" and v not in keep:
                        last[v] = i
        out: list = [[] for _ in self.ops]
        for v, i in last.items():
            out[i].append(v)
        return out

    def _execute(self, env: dict, free: bool = True) -> None:
        dead = self._last_uses() if free else [[] for _ in self.ops]
        for o, gone in zip(self.ops, dead):
            kernel = OPS.get(o.type)
            if kernel is None:
                raise UnsupportedOpError(
                    f"the MIL emulator has no kernel for op '{o.type}' ({o.name}): add it to vitedge/targets/coreml/mil_ops.py "
                    "or run the CoreML hop on macOS")
            args = OpArgs(o.type, o.name, {k: _resolve(v, env) for k, v in o.inputs.items()},
                          [dt for _, dt in o.outputs])
            try:
                results = kernel(args)
            except UnsupportedOpError:
                raise
            except Exception as e:  # name the op: a kernel error without it is useless
                raise RuntimeError(f"MIL op {o.type} ({o.name}) failed: {type(e).__name__}: {e}") from e
            if len(results) != len(o.outputs):
                raise RuntimeError(f"MIL op {o.type} ({o.name}) gave {len(results)} outputs, program declares "
                                   f"{len(o.outputs)}")
            for (vname, dtype), val in zip(o.outputs, results):
                env[vname] = as_declared(val, dtype)
            for v in gone:
                env.pop(v, None)


def _resolve(binding, env):
    if isinstance(binding, list):
        return [_resolve(b, env) for b in binding]
    kind, v = binding
    return env[v] if kind == "var" else v


def _decode_value(ctx, value_spec):
    from coremltools.converters.mil.frontend.milproto.load import _load_value
    v = _load_value(ctx, value_spec)
    if isinstance(v, np.ndarray) and v.dtype == np.float16:
        return v.astype(np.float32)  # exact; fp16-ness is tracked by the declared dtype
    if isinstance(v, np.generic):
        return np.asarray(v.astype(np.float32) if v.dtype == np.float16 else v)
    return v


def _decode_binding(ctx, b):
    kind = b.WhichOneof("binding")
    if kind == "name":
        return ("var", b.name)
    value = b.value
    if value.WhichOneof("value") == "immediateValue" and value.immediateValue.WhichOneof("value") == "list":
        # classify's class labels: a list of scalar values
        return ("val", [np.asarray(_decode_value(ctx, e)).item() for e in value.immediateValue.list.values])
    return ("val", _decode_value(ctx, value))


def package_paths(path: Path) -> tuple[Path, Path | None]:
    """(root model.mlmodel, weights folder) of an .mlpackage, resolved through its Manifest.json."""
    with quiet_coremltools():
        from coremltools.libmodelpackage import ModelPackage
    path = Path(path)
    if not path.is_dir() or not (path / "Manifest.json").is_file():
        raise MILProgramError(f"{path} is not an .mlpackage folder (no Manifest.json): pass the .mlpackage itself")
    try:
        pkg = ModelPackage(str(path))
        spec_file = Path(pkg.getRootModel().path())
        item = pkg.findItemByNameAuthor("weights", "com.apple.CoreML")
    except Exception as e:
        raise MILProgramError(f"{path}: its Manifest.json does not resolve ({e}); re-export the model") from None
    return spec_file, (Path(item.path()) if item is not None else None)


def load_program(path: str | Path, function: str | None = None) -> MILProgram:
    """Read an .mlpackage's ML Program (ops, declared dtypes, const values from weight.bin): its `function`, by
    default the package's default one ("main" but in a multifunction package)."""
    with quiet_coremltools():
        from coremltools.converters.mil.frontend.milproto.load import TranscriptionContext
        from coremltools.proto import Model_pb2
    spec_file, weights_dir = package_paths(Path(path))
    spec = Model_pb2.Model()
    spec.ParseFromString(spec_file.read_bytes())
    if spec.WhichOneof("Type") != "mlProgram":
        raise MILProgramError(f"{path} holds a {spec.WhichOneof('Type')} model, not an ML Program; "
                              "convert with convert_to='mlprogram'")
    prog = spec.mlProgram
    function = function or spec.description.defaultFunctionName or "main"
    if function not in prog.functions:
        raise MILProgramError(f"{path} has no function {function!r} (has {list(prog.functions)})")
    fn = prog.functions[function]
    block = fn.block_specializations[fn.opset]
    ctx = TranscriptionContext(str(weights_dir) if weights_dir else "")
    inputs = {i.name: (_type_name(i.type), _shape(i.type)) for i in fn.inputs}
    ops, consts, const_dtypes = [], {}, {}
    try:
        for o in block.operations:
            if o.blocks:
                raise UnsupportedOpError(f"the MIL emulator does not run control flow (op '{o.type}' has nested blocks)")
            outputs = [(v.name, _type_name(v.type)) for v in o.outputs]
            if o.type == "const":
                name, dtype = outputs[0]
                consts[name] = as_declared(_decode_value(ctx, o.attributes["val"]), dtype)
                const_dtypes[name] = dtype
                continue
            op_inputs = {}
            if o.type.startswith("constexpr_"):  # iOS 16 constexpr ops carry their constant params as attributes
                op_inputs.update({k: ("val", _decode_value(ctx, v)) for k, v in o.attributes.items() if k != "name"})
            for param, arg in o.inputs.items():
                bindings = [_decode_binding(ctx, b) for b in arg.arguments]
                op_inputs[param] = bindings if (len(bindings) > 1 or param in _TUPLE_PARAMS) else bindings[0]
            name = o.attributes["name"].immediateValue.tensor.strings.values[0] if "name" in o.attributes else ""
            ops.append(Op(o.type, name, op_inputs, outputs))
    except (UnsupportedOpError, MILProgramError):
        raise
    except Exception as e:
        raise MILProgramError(f"{path}: cannot decode the program or its weights ({type(e).__name__}: {e}); "
                              "the package may be corrupt, re-export it") from None
    finally:
        ctx.blob_reader_from_filename.clear()  # release weight.bin
    return MILProgram(Path(path), fn.opset, inputs, list(block.outputs), ops, consts, const_dtypes, spec, function)
