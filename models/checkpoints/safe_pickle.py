"""Restricted reading of `torch.save` files: tensors and plain data come back, code from the file never runs.

A `.pth` file is a pickle, and a pickle can name any importable callable and call it while loading
(`__reduce__`). `torch.load(weights_only=True)` refuses every class it does not know, which rejects the
official training containers (SwiftFormer/SimA save `args` as an `argparse.Namespace`, SLAB saves its
yacs `CfgNode` config). This unpickler sits in between:

- `find_class` never imports anything. It returns the tensor-rebuild shims below, a few value types
  (OrderedDict, set, complex, torch.Size, torch dtypes/devices) or, for every other name, an INERT
  placeholder class that records module/name/state.
- Placeholders may be *instantiated the way plain objects are pickled* (`cls.__new__` + state: NEWOBJ,
  `copyreg._reconstructor`) - that is how Namespace/CfgNode arrive, and it runs no code of theirs.
- *Calling* a placeholder (REDUCE/INST/OBJ: `os.system(...)`, `eval(...)`, `functools.partial(...)`)
  raises `CheckpointError`: loading refuses to run code from the file.
- BUILD (setting state) is allowed only on placeholders and on state_dict OrderedDicts, so the file cannot
  poke attributes of live objects; this is why the pure-Python `pickle._Unpickler` is the base class.
- Storages are read from the archive records with their sizes checked before anything is allocated
  (and compressed records may not expand more than 200x: no zip bombs).

Formats: the zip archive of `torch.save` (torch >= 1.6) and the legacy single-pickle stream
(`_use_new_zipfile_serialization=False`), pickle protocols 1-5. Protocol 0 and the tar format of
torch < 0.4 are refused with a clear message.

Length: one job, a restricted unpickler for both torch.save formats (zip and legacy), whose every opcode
and refusal must be read together to trust it.
"""
from __future__ import annotations

import _compat_pickle
import collections
import io
import math
import pickle
import struct
import sys
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any, BinaryIO

import torch

from ...errors import CheckpointError

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch.serialization.MAGIC_NUMBER
LEGACY_PROTOCOL = 1001
_LEGACY_TEXT_MAGIC = pickle.dumps(LEGACY_MAGIC, protocol=0)[:-1]  # b"L1195...L\n", protocols 0 and 1

# Legacy typed-storage class names as torch.save writes them (`torch FloatStorage`).
_STORAGE_DTYPES = {
    "DoubleStorage": torch.float64, "FloatStorage": torch.float32, "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16, "LongStorage": torch.int64, "IntStorage": torch.int32,
    "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool, "ComplexFloatStorage": torch.complex64, "ComplexDoubleStorage": torch.complex128,
    "UntypedStorage": torch.uint8,
}

REFUSAL_FIX = ("if you trust the file, convert it once in a separate Python with "
               "torch.save(torch.load(f, weights_only=False)['model'], 'weights.pth') "
               "- or re-save only the state_dict with torch.save(model.state_dict(), path)")


class UnsafePickleError(CheckpointError):
    """The file asks to call a callable that is not a tensor-rebuild function."""


class _Corrupt(Exception):
    """Internal: a structurally invalid pickle; turned into a CheckpointError naming the file."""


class _Unsupported(Exception):
    """Internal: a valid but unsupported variant of the format; the message says how to re-save it."""


# --------------------------------------------------------------------------------------------------
# Inert placeholders
# --------------------------------------------------------------------------------------------------
class _InertMeta(type):
    """Metaclass of placeholders: creating one *by calling it* is the code-execution path - refuse."""

    def __call__(cls, *args, **kwargs):
        raise UnsafePickleError(f"{cls.qualified_name}")

    def __repr__(cls):
        return f"<inert placeholder for {cls.qualified_name}>"


class Inert(metaclass=_InertMeta):
    """Stand-in for an object of a class the checkpoint names; the real class is never imported.

    Holds what the pickle gave it: `__new__` arguments, `__setstate__` state, and dict/list items
    (yacs `CfgNode` is a dict subclass, pickled with SETITEMS).
    """

    module = ""
    name = ""
    qualified_name = ""

    def __new__(cls, *args, **kwargs):
        obj = object.__new__(cls)
        object.__setattr__(obj, "_inert", {"args": args, "state": None, "items": {}, "list": []})
        return obj

    def __setstate__(self, state):
        self._inert["state"] = state

    def __setitem__(self, key, value):
        self._inert["items"][key] = value

    def append(self, value):
        self._inert["list"].append(value)

    def extend(self, values):
        self._inert["list"].extend(values)

    def __repr__(self):
        return f"<inert {type(self).qualified_name}>"

    def to_plain(self) -> Any:
        """The recorded content as plain data: a Namespace becomes its attribute dict, a CfgNode its items."""
        d = self._inert
        state = d["state"]
        if isinstance(state, tuple) and len(state) == 2 and all(s is None or isinstance(s, dict) for s in state):
            state = {**(state[0] or {}), **(state[1] or {})}  # (dict state, slot state)
        if d["items"] or d["list"]:
            return dict(d["items"]) if d["items"] else list(d["list"])
        if isinstance(state, dict):
            return {k: v for k, v in state.items() if not (isinstance(k, str) and k.startswith("__"))}
        return state if state is not None else list(d["args"])


def _placeholder(module: str, name: str) -> type:
    qual = f"{module}.{name}"
    return _InertMeta(name if name.isidentifier() else "Inert", (Inert,),
                      {"module": module, "name": name, "qualified_name": qual, "__module__": __name__})


# --------------------------------------------------------------------------------------------------
# Allow-listed callables: small shims that validate their arguments (never torch's own pickled paths)
# --------------------------------------------------------------------------------------------------
@dataclass
class _Storage:
    """A storage record: raw bytes (shared with the tensors built on it) and the dtype it was saved as."""
    data: torch.UntypedStorage
    dtype: torch.dtype
    nbytes: int


class _TypeMarker:
    """`torch.Tensor` / `Parameter` as *arguments* (of `_rebuild_from_type_v2`), never callable."""

    def __init__(self, name):
        self.name = name


_TENSOR_TYPES = {("torch._tensor", "Tensor"): _TypeMarker("Tensor"), ("torch", "Tensor"): _TypeMarker("Tensor"),
                 ("torch.nn.parameter", "Parameter"): _TypeMarker("Parameter")}


def _is_int_tuple(x) -> bool:
    return isinstance(x, (tuple, list, torch.Size)) and all(type(v) is int for v in x)


def _rebuild(storage, offset, size, stride, dtype=None) -> torch.Tensor:
    if not isinstance(storage, _Storage):
        raise _Corrupt(f"a tensor without storage ({type(storage).__name__})")
    if type(offset) is not int or not _is_int_tuple(size) or not _is_int_tuple(stride) or len(size) != len(stride):
        raise _Corrupt("a tensor with invalid offset/size/stride")
    dtype = dtype or storage.dtype
    if not isinstance(dtype, torch.dtype):
        raise _Corrupt("a tensor with an invalid dtype")
    if any(s < 0 for s in size) or any(s < 0 for s in stride) or offset < 0:
        raise _Corrupt("a tensor with negative size/stride/offset")
    if math.prod(size):
        extent = offset + sum((n - 1) * s for n, s in zip(size, stride)) + 1
        if extent * dtype.itemsize > storage.nbytes:
            raise _Corrupt(f"a tensor of shape {tuple(size)} larger than its storage ({storage.nbytes} bytes)")
    return torch.empty((0,), dtype=dtype).set_(storage.data, offset, tuple(size), tuple(stride))


def _check_hooks(hooks) -> None:
    # Official files always carry an empty OrderedDict here; hooks would be callables.
    if hooks:
        raise _Corrupt("a tensor with backward hooks")


def _rebuild_tensor(storage, offset, size, stride):
    return _rebuild(storage, offset, size, stride)


def _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, backward_hooks, metadata=None):
    _check_hooks(backward_hooks)
    t = _rebuild(storage, offset, size, stride)
    if metadata:  # conj/neg bits: a dict of bools only
        if not (isinstance(metadata, dict) and all(isinstance(v, bool) for v in metadata.values())):
            raise _Corrupt("a tensor with invalid metadata")
        torch._utils.set_tensor_metadata(t, metadata)
    return t


def _rebuild_tensor_v3(storage, offset, size, stride, requires_grad, backward_hooks, dtype, metadata=None):
    _check_hooks(backward_hooks)
    return _rebuild(storage, offset, size, stride, dtype)


def _rebuild_parameter(data, requires_grad, backward_hooks, state=None):
    # A state_dict wants the values; Parameter-ness would not survive load_state_dict anyway.
    if not isinstance(data, torch.Tensor):
        raise _Corrupt("a Parameter without tensor data")
    _check_hooks(backward_hooks)
    return data


def _rebuild_from_type_v2(func, new_type, args, state):
    if func not in _TENSOR_FUNCS or not isinstance(new_type, _TypeMarker) or not isinstance(args, tuple):
        raise _Corrupt("an unsupported tensor subclass")
    return func(*args)


def _reconstructor(cls, base, state):
    # copyreg._reconstructor (protocol 0/1 objects): object.__new__(cls) + base init from `state`.
    if isinstance(cls, type) and issubclass(cls, Inert) and base in (object, dict, list):
        obj = cls.__new__(cls)
        if state is not None:
            obj.__setstate__(state)
        return obj
    if cls is collections.OrderedDict and base is dict:
        return collections.OrderedDict(state or ())
    raise _Corrupt("an object reconstruction that is not a plain object")


def _codecs_encode(text, encoding="utf-8"):
    # How protocol-2 pickles store bytes: _codecs.encode(str, 'latin1').
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1", "utf-8", "utf8", "ascii"):
        raise _Corrupt("an invalid bytes encoding")
    return text.encode(encoding)


def _bytearray(data=b"", *enc):
    if isinstance(data, int):  # bytearray(10**12) would be an allocation bomb
        raise _Corrupt("an invalid bytearray")
    return bytearray(data, *enc) if enc else bytearray(data)


def _pure_path(*parts):
    # Paths inside `args` are values; keep them as strings (no filesystem access either way).
    if not all(isinstance(p, str) for p in parts):
        raise _Corrupt("an invalid path")
    return str(PurePath(*parts))


# Looked up in a table: `getattr(torch, name)` could trigger torch's lazy submodule imports.
_DTYPES = {n: v for n, v in vars(torch).items() if isinstance(v, torch.dtype)}

_TENSOR_FUNCS = {_rebuild_tensor, _rebuild_tensor_v2, _rebuild_tensor_v3, _rebuild_parameter}

_ALLOWED: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("copyreg", "_reconstructor"): _reconstructor,
    ("_codecs", "encode"): _codecs_encode,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "complex"): complex,
    ("builtins", "slice"): slice,
    ("builtins", "bytearray"): _bytearray,
    ("builtins", "object"): object,  # only ever an argument of _reconstructor
    ("builtins", "dict"): dict,
    ("builtins", "list"): list,
    ("torch", "Size"): torch.Size,
    ("torch", "device"): torch.device,
    **{("pathlib", n): _pure_path for n in ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath",
                                            "PureWindowsPath")},
    **_TENSOR_TYPES,
}


# --------------------------------------------------------------------------------------------------
# The unpickler
# --------------------------------------------------------------------------------------------------
class RestrictedUnpickler(pickle._Unpickler):
    """Pure-Python unpickler whose globals are shims, value types or inert placeholders (see module doc).

    The pure-Python implementation (not the C one) so that BUILD can be restricted too: it would
    otherwise let the file set attributes or call `__setstate__` on live objects (tensors, the shims).
    """

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file: BinaryIO, storage_loader=None):
        super().__init__(file, encoding="utf-8")
        self._storage_loader = storage_loader
        self.placeholders: dict[str, type] = {}

    def load_build(self) -> None:
        state, inst = self.stack[-1], self.stack[-2]
        if isinstance(inst, Inert):  # records the state, nothing else
            inst.__setstate__(state)
        elif type(inst) is collections.OrderedDict and isinstance(state, dict) and all(type(k) is str for k in state):
            inst.__dict__.update(state)  # a state_dict's `_metadata` attribute
        else:
            raise _Corrupt(f"state set on a {type(inst).__name__}")
        self.stack.pop()

    dispatch[pickle.BUILD[0]] = load_build

    def find_class(self, module: str, name: str) -> Any:
        # Python-2 names that protocol-2 pickles still write (`__builtin__ set`): a table lookup, no import.
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module == "torch" and name in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[name]  # a storage type is just its dtype here
        if module == "torch" and name in _DTYPES:
            return _DTYPES[name]  # dtypes are plain values
        qual = f"{module}.{name}"
        if qual not in self.placeholders:
            self.placeholders[qual] = _placeholder(module, name)
        return self.placeholders[qual]

    def persistent_load(self, pid: Any) -> Any:
        if self._storage_loader is None:
            raise _Corrupt("a persistent reference outside a torch archive")
        if isinstance(pid, str):
            raise _Unsupported("was saved with pickle protocol 0, which is not supported: re-save it with "
                               "torch.save's default protocol")
        if isinstance(pid, tuple) and len(pid) == 4 and pid[0] in ("module", b"module"):
            return pid[1]  # legacy whole-module pickles: (tag, class, source file, source) -> the (inert) class
        if not isinstance(pid, tuple) or not pid or pid[0] not in ("storage", b"storage"):
            raise _Corrupt(f"an unknown persistent reference ({str(pid)[:40]})")
        return self._storage_loader(pid[1:])


def _run_unpickler(unpickler: RestrictedUnpickler, where: str) -> Any:
    try:
        return unpickler.load()
    except (CheckpointError, _Corrupt, _Unsupported):
        raise
    except RecursionError:
        raise _Corrupt(f"too deeply nested data in {where}") from None
    except Exception as e:  # UnpicklingError, EOFError, TypeError from a bad opcode stream, ...
        raise _Corrupt(f"invalid pickle data in {where} ({type(e).__name__}: {str(e)[:80]})") from None


@dataclass
class TorchFile:
    """What a torch.save file held: the unpickled object, its format and the classes kept inert."""
    obj: Any
    format: str  # "torch-zip" | "torch-legacy" | "safetensors" | "in-memory"
    placeholders: list[str] = field(default_factory=list)
    metadata: dict = field(default_factory=dict)  # format-level metadata (safetensors header)


def _dtype_of(storage_type: Any) -> torch.dtype:
    if isinstance(storage_type, torch.dtype):
        return storage_type
    raise _Corrupt(f"an unsupported storage type ({storage_type!r})")


def _byteswap(buf: bytearray, dtype: torch.dtype) -> None:
    size = dtype.itemsize
    if size > 1:
        t = torch.frombuffer(buf, dtype=torch.uint8).view(-1, size)
        t.copy_(t.flip(1))


def _storage_from(buf: bytearray, dtype: torch.dtype) -> _Storage:
    data = torch.frombuffer(buf, dtype=torch.uint8).untyped_storage() if buf else torch.UntypedStorage(0)
    return _Storage(data, dtype, len(buf))


def _check_record(info: zipfile.ZipInfo) -> None:
    # torch.save stores records uncompressed; a compressed record may not expand absurdly (zip bombs).
    if info.compress_type == zipfile.ZIP_STORED:
        if info.file_size != info.compress_size:
            raise _Corrupt(f"record {info.filename} has inconsistent sizes")
    elif info.file_size > 200 * info.compress_size + (1 << 20):
        raise _Corrupt(f"record {info.filename} expands {info.file_size} bytes from {info.compress_size}")


def _load_zip(path: Path, zf: zipfile.ZipFile) -> TorchFile:
    names = zf.namelist()
    if any(n.endswith("constants.pkl") for n in names):
        raise CheckpointError(f"{path} is a TorchScript archive (torch.jit.save), not a checkpoint: "
                              "save the weights with torch.save(model.state_dict(), path)")
    pkl = [n for n in names if n.endswith("data.pkl") and n.count("/") <= 1]
    if not pkl:
        raise CheckpointError(f"{path} is a zip archive without data.pkl, not a torch.save checkpoint")
    prefix = pkl[0][: -len("data.pkl")]
    infos = {i.filename: i for i in zf.infolist()}
    big_endian = prefix + "byteorder" in infos and zf.read(prefix + "byteorder") == b"big"
    storages: dict[str, _Storage] = {}

    def load_storage(args: tuple) -> _Storage:
        if len(args) != 4:
            raise _Corrupt("a storage reference of the wrong form")
        storage_type, key, _location, numel = args
        dtype = _dtype_of(storage_type)
        if not isinstance(key, str) or type(numel) is not int or numel < 0:
            raise _Corrupt("a storage reference of the wrong form")
        if key in storages:
            return storages[key]
        info = infos.get(f"{prefix}data/{key}")
        if info is None:
            raise _Corrupt(f"a missing tensor record data/{key}")
        nbytes = numel * dtype.itemsize
        _check_record(info)
        if info.file_size != nbytes:  # checked before allocating anything
            raise _Corrupt(f"tensor record data/{key} holds {info.file_size} bytes, expected {nbytes}")
        buf = bytearray(nbytes)
        try:
            with zf.open(info) as f:  # zipfile checks the record's CRC on the way
                if f.readinto(buf) != nbytes:
                    raise _Corrupt(f"a short tensor record data/{key}")
                f.read(1)  # reach EOF so the CRC is verified
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            raise _Corrupt(f"tensor record data/{key} is damaged ({e})") from None
        if big_endian and sys.byteorder == "little":
            _byteswap(buf, dtype)
        storages[key] = _storage_from(buf, dtype)
        return storages[key]

    _check_record(infos[pkl[0]])
    unpickler = RestrictedUnpickler(io.BytesIO(zf.read(pkl[0])), load_storage)
    obj = _run_unpickler(unpickler, "data.pkl")
    return TorchFile(obj, "torch-zip", sorted(unpickler.placeholders))


def _load_legacy(path: Path, f: BinaryIO, size: int) -> TorchFile:
    def plain_load():
        return _run_unpickler(RestrictedUnpickler(f), "the header")

    if plain_load() != LEGACY_MAGIC:
        raise CheckpointError(f"{path} is a pickle but not a torch.save checkpoint (no torch magic number): "
                              "save the weights with torch.save(model.state_dict(), path)")
    if plain_load() != LEGACY_PROTOCOL:
        raise _Corrupt("an unknown legacy protocol version")
    sys_info = plain_load()
    little = not (isinstance(sys_info, dict) and sys_info.get("little_endian") is False)
    storages: dict[str, tuple[bytearray, _Storage]] = {}

    def load_storage(args: tuple) -> _Storage:
        if len(args) != 5:
            raise _Corrupt("a storage reference of the wrong form")
        storage_type, key, _location, numel, view = args
        dtype = _dtype_of(storage_type)
        if view is not None:
            raise _Unsupported("uses storage views of torch < 0.4, which are not supported: re-save it with a "
                               "current torch")
        if not isinstance(key, str) or type(numel) is not int or numel < 0:
            raise _Corrupt("a storage reference of the wrong form")
        if key not in storages:
            nbytes = numel * dtype.itemsize
            if nbytes > size:  # never allocate more than the file could hold
                raise _Corrupt(f"a storage of {nbytes} bytes in a {size}-byte file")
            buf = bytearray(nbytes)
            storages[key] = (buf, _storage_from(buf, dtype))
        return storages[key][1]

    unpickler = RestrictedUnpickler(f, load_storage)
    obj = _run_unpickler(unpickler, "the checkpoint")
    keys = plain_load()
    if not isinstance(keys, list) or set(keys) != set(storages):
        raise _Corrupt("a storage key list that does not match the tensors")
    for key in keys:
        buf, st = storages[key]
        header = f.read(8)
        if len(header) != 8:
            raise _Corrupt("truncated tensor data")
        (numel,) = struct.unpack("<q", header)
        if numel * st.dtype.itemsize != len(buf) or f.readinto(buf) != len(buf):
            raise _Corrupt("truncated or inconsistent tensor data")
        if not little and sys.byteorder == "little":
            _byteswap(buf, st.dtype)
    return TorchFile(obj, "torch-legacy", sorted(unpickler.placeholders))


def load_torch_file(path: str | Path) -> TorchFile:
    """Read a `torch.save` file without executing code from it.

    Raises CheckpointError (one line) for a corrupt/truncated file, a pickle that calls anything but a
    tensor-rebuild function (`UnsafePickleError`), or a format that is not a torch.save file.
    """
    path = Path(path)
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            head = f.read(32)
            f.seek(0)
            if head.startswith(b"PK"):
                try:
                    zf = zipfile.ZipFile(f)
                except (zipfile.BadZipFile, OSError, ValueError) as e:
                    raise CheckpointError(f"{path} is a truncated or corrupt zip archive ({e}): re-download or "
                                          "re-save it") from None
                with zf:
                    return _load_zip(path, zf)
            if head[:1] == b"\x80" or head.startswith(_LEGACY_TEXT_MAGIC):  # pickle protocol >= 2, or 0/1
                return _load_legacy(path, f, size)
            if _is_tar(path):
                raise CheckpointError(f"{path} is a torch < 0.4 tar checkpoint, which is not supported: "
                                      "re-save it with a current torch")
    except UnsafePickleError as e:
        raise UnsafePickleError(f"{path}: refusing to run code from the checkpoint (it calls {e}); "
                                f"{REFUSAL_FIX}") from None
    except _Corrupt as e:
        raise CheckpointError(f"{path} is corrupt or truncated: {e}; re-download or re-save it") from None
    except _Unsupported as e:
        raise CheckpointError(f"{path} {e}") from None
    except zipfile.BadZipFile as e:
        raise CheckpointError(f"{path} is corrupt ({e}); re-download or re-save it") from None
    except OSError as e:
        raise CheckpointError(f"{path} cannot be read ({e.strerror or e}); check its permissions") from None
    raise CheckpointError(f"{path} is not a checkpoint: neither a torch.save file (zip or legacy pickle) "
                          "nor a .safetensors file")


def _is_tar(path: Path) -> bool:
    try:
        return tarfile.is_tarfile(path)
    except OSError:
        return False
