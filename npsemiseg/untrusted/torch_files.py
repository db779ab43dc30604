"""Torch files from others, inspected before torch builds anything of them, then read with ``weights_only=True``.

``torch.load(weights_only=True)`` bounds what runs, not what it allocates: ``bytearray(n)`` is on torch's own
allow-list, numpy's ``_reconstruct`` builds an array of any shape, a deflated zip record inflates without limit.
So :func:`load_torch_file` first checks, without building an object:

- the zip records (what torch's reader inflates into memory): the bytes they declare, all records together, at
  most :data:`INFLATION_RATIO` times the file's size on disk plus :data:`INFLATION_SLACK`; only stored and
  deflated records; no name twice (two readers must not see two files);
- the pickle (``pickletools.genops`` over ``data.pkl``, its stack followed): only the globals that tensors, plain
  containers and optimiser states need (:data:`TORCH_GLOBALS`) and the caller's ``allow``; each storage it declares
  (elements x element size) within the record that holds its bytes; each tensor's view within its storage; an
  allowed numpy array (the legacy RNG key of older checkpoints) of uint32, at most :data:`NUMPY_MAX_ELEMENTS` elements.

A torch file of the legacy (pre-zip) format is checked the same way, its storages together within the file's
size. Anything else about the file is torch's to judge; what it allocates is then bounded by the file's size.
"""

from __future__ import annotations

import math
import os
import pickletools
import re
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

import torch

from npsemiseg.untrusted.errors import UnsafeFileError

#: the records of a torch zip may declare at most this many bytes per byte of the file on disk, all together
#: (torch writes them stored, 1:1; a re-zipped checkpoint deflates to 0.9x at best) ...
INFLATION_RATIO = 4
#: ... plus this much (small files: a few records of bookkeeping)
INFLATION_SLACK = 1 << 20
#: the numpy array a checkpoint may hold: numpy's legacy RNG state's MT19937 key, 624 uint32
NUMPY_MAX_ELEMENTS = 624

#: the globals a tensor, a plain container or an optimiser state needs (not torch's whole allow-list: it has
#: ``bytearray(n)``, sparse, quantised, nested and meta tensors, none of which the project writes or reads)
TORCH_GLOBALS = frozenset({
    "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_parameter", "collections.OrderedDict",
    "builtins.set", "__builtin__.set", "_codecs.encode", "torch.Size", "torch.device",
    *(f"torch.{name}" for name in dir(torch) if isinstance(getattr(torch, name, None), torch.dtype)),
    *(f"torch.{kind}Storage" for kind in ("Float", "Double", "Half", "BFloat16", "Long", "Int", "Short", "Char",
                                          "Byte", "Bool", "ComplexFloat", "ComplexDouble")),
})

#: how torch's weights-only unpickler names what it refused: a global to import, or a type to build
_REFUSED = re.compile(r"GLOBAL\s+([\w.]+)|but got <class '([\w.]+)'>")
_ZIP_MAGIC = b"PK\x03\x04"  # how torch tells a zip file from a legacy one: its first bytes


def load_torch_file(path: str | os.PathLike, *, what: str, allow: Sequence[Any] = ()) -> Any:
    """``torch.load`` of ``path`` on CPU with ``weights_only=True`` after :func:`check_torch_file`; ``allow``: the
    exact extra globals (types, functions) this reader accepts, only for this call. A refused file is an
    :class:`UnsafeFileError` ``"<what>: <path> asks to load <module.name> ..."`` (or names the size it asks for);
    other read errors propagate unchanged."""
    check_torch_file(path, what=what, allow=allow)
    try:
        with torch.serialization.safe_globals(list(allow)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch wraps the unpickler's refusal in an UnpicklingError
        found = _REFUSED.search(str(error))
        if found is None:
            raise
        raise _refused(what, path, found.group(1) or found.group(2)) from None


def _refused(what: str, path: str | os.PathLike, name: str) -> UnsafeFileError:
    return UnsafeFileError(f"{what}: {path} asks to load {name}, which is not a tensor or plain data; refused "
                           "without running it (files from others are read as data only)")


def global_name(obj: Any) -> str:
    """How a pickle names ``obj``, as torch's unpickler matches it: ``module.name``."""
    return f"{obj.__module__}.{obj.__name__}"


def check_torch_file(path: str | os.PathLike, *, what: str, allow: Sequence[Any] = ()) -> None:
    """Refuse ``path`` with :class:`UnsafeFileError` when reading it would import a global outside
    :data:`TORCH_GLOBALS` and ``allow`` or allocate more than its size allows (module docstring); nothing built."""
    allowed = TORCH_GLOBALS | {global_name(obj) for obj in allow}
    with open(path, "rb") as file:
        is_zip = file.read(4) == _ZIP_MAGIC
        if not is_zip:
            file.seek(0)
            _check_legacy(file, _Inspection(what, path, allowed, os.fstat(file.fileno()).st_size))
            return
    try:
        with zipfile.ZipFile(path) as archive:
            records = _check_records(archive, what, path)
            prefix = archive.infolist()[0].filename.split("/", 1)[0]
            if f"{prefix}/data.pkl" not in records:
                raise ValueError(f"{what}: {path} is a zip file without {prefix}/data.pkl, not a torch file")
            with archive.open(f"{prefix}/data.pkl") as pickled:
                storages = {name.removeprefix(f"{prefix}/data/"): size for name, size in records.items()
                            if name.startswith(f"{prefix}/data/")}
                _Inspection(what, path, allowed, 0, storages).run(pickled)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError) as error:
        raise ValueError(f"{what}: {path} is not a readable torch file (its zip: {error})") from None


def _check_records(archive: zipfile.ZipFile, what: str, path: str | os.PathLike) -> dict[str, int]:
    """Record name -> the bytes it inflates to, after the size, ratio, method and duplicate checks."""
    infos = archive.infolist()
    on_disk = os.path.getsize(path)
    declared = sum(info.file_size for info in infos)
    budget = INFLATION_RATIO * on_disk + INFLATION_SLACK
    if declared > budget:
        raise UnsafeFileError(f"{what}: {path} asks to inflate its zip records to {declared:,} bytes from {on_disk:,} "
                              f"on disk, more than the {budget:,} a torch file of its size may take (a zip bomb); "
                              "refused before inflating any")
    records = {info.filename: info.file_size for info in infos}
    if len(records) != len(infos) or not infos:
        raise UnsafeFileError(f"{what}: {path} names a zip record twice (or none); refused")
    odd = [info.filename for info in infos if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)]
    if odd:
        raise UnsafeFileError(f"{what}: {path}: zip record {odd[0]} is neither stored nor deflated; refused")
    return records


def _check_legacy(file: IO[bytes], inspection: _Inspection) -> None:
    """The legacy format: a magic number, a protocol version and the system's info (three small pickles), then the
    object; its storages' bytes follow it, so together they fit in the file."""
    for _ in range(4):
        inspection.run(file)


@dataclass(frozen=True)
class _Global:
    name: str


@dataclass(frozen=True)
class _Call:
    name: str
    args: Any


@dataclass(frozen=True)
class _Storage:
    key: str
    elements: int


_MARK, _OPAQUE = object(), object()
_LITERALS = frozenset({"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
                       "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE",
                       "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8"})
_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False, "EMPTY_TUPLE": ()}
_TUPLES = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
#: opcodes followed by their stack effect only (containers are opaque here: only tuples carry values)
_GENERIC = frozenset({"EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET", "APPEND", "APPENDS", "SETITEM", "SETITEMS", "LIST",
                      "DICT", "ADDITEMS", "FROZENSET", "POP", "POP_MARK", "PROTO", "FRAME", "STOP"})


class _Inspection:
    """One torch file's pickles followed opcode by opcode (``pickletools.genops``), a stack of stand-ins kept:
    literals and tuples as themselves, globals, calls and storages as records, containers opaque."""

    def __init__(self, what: str, path: str | os.PathLike, allowed: frozenset[str], file_budget: int,
                 records: dict[str, int] | None = None) -> None:
        self.what, self.path, self.allowed = what, path, allowed
        self.file_budget, self.records = file_budget, records  # legacy: the file's size; zip: each record's
        self.storages: dict[str, int] = {}
        self.stack: list[Any] = []
        self.memo: dict[int, Any] = {}

    def refuse(self, reason: str) -> UnsafeFileError:
        return UnsafeFileError(f"{self.what}: {self.path} {reason}; refused before building anything of it "
                               "(files from others are read within a budget)")

    def run(self, stream: IO[bytes]) -> None:
        """Follow one pickle of ``stream`` up to its STOP."""
        self.stack, self.memo = [], {}
        try:
            for opcode, arg, _ in pickletools.genops(stream):
                self.step(opcode, arg)
        except (ValueError, IndexError, KeyError, TypeError, EOFError) as error:
            if isinstance(error, UnsafeFileError):
                raise
            raise ValueError(f"{self.what}: {self.path} is not a torch file this project reads (its pickle: "
                             f"{type(error).__name__}: {error})") from None

    def step(self, opcode: pickletools.OpcodeInfo, arg: Any) -> None:
        name, stack = opcode.name, self.stack
        if name in _LITERALS:
            stack.append(arg)
        elif name in _CONSTANTS:
            stack.append(_CONSTANTS[name])
        elif name == "MARK":
            stack.append(_MARK)
        elif name in _TUPLES:
            items = stack[len(stack) - _TUPLES[name]:]
            del stack[len(stack) - _TUPLES[name]:]
            stack.append(tuple(items))
        elif name == "TUPLE":
            stack.append(tuple(self.pop_to_mark()))
        elif name in ("GLOBAL", "STACK_GLOBAL"):
            stack.append(self.global_(arg.replace(" ", ".") if name == "GLOBAL" else self.stack_global()))
        elif name == "REDUCE":
            args, function = stack.pop(), stack.pop()
            stack.append(self.call(function, args))
        elif name == "BUILD":
            self.build(stack.pop(), stack[-1])
        elif name == "BINPERSID":
            stack.append(self.storage(stack.pop()))
        elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
            self.memo[len(self.memo) if name == "MEMOIZE" else arg] = stack[-1]
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            stack.append(self.memo[arg])
        elif name == "DUP":
            stack.append(stack[-1])
        elif name in _GENERIC:
            self.generic(opcode)
        else:
            raise self.refuse(f"uses the pickle opcode {name}, which torch.save does not write")

    def pop_to_mark(self) -> list[Any]:
        at = len(self.stack) - 1 - self.stack[::-1].index(_MARK)
        items = self.stack[at + 1:]
        del self.stack[at:]
        return items

    def generic(self, opcode: pickletools.OpcodeInfo) -> None:
        before = opcode.stack_before
        if pickletools.markobject in before:
            self.pop_to_mark()
            before = before[:before.index(pickletools.markobject)]
        del self.stack[len(self.stack) - len(before):]
        self.stack.extend(_OPAQUE for _ in opcode.stack_after)

    def stack_global(self) -> str:
        name, module = self.stack.pop(), self.stack.pop()
        if not (isinstance(module, str) and isinstance(name, str)):
            raise self.refuse("names a global by values this inspection cannot follow")
        return f"{module}.{name}"

    def global_(self, name: str) -> _Global:
        name = "builtins" + name[len("__builtin__"):] if name.startswith("__builtin__.") else name
        if name not in self.allowed:
            raise _refused(self.what, self.path, name)
        return _Global(name)

    def call(self, function: Any, args: Any) -> _Call:
        if not isinstance(function, _Global) or not isinstance(args, tuple):
            raise self.refuse("calls something other than an allowed global with a tuple")
        if function.name == "torch._utils._rebuild_tensor_v2":
            self.check_view(args)
        elif function.name.endswith("multiarray._reconstruct") and args[1:2] != ((0,),):
            raise self.refuse(f"asks numpy for an array of shape {args[1:2]} (numpy pickles arrays as shape (0,) "
                              "then fills them)")
        elif function.name == "numpy.dtype" and args[:1] != ("u4",):
            raise self.refuse(f"asks for the numpy dtype {str(args[:1])[:40]}; the one numpy array a checkpoint may "
                              "hold (numpy's legacy RNG key) is uint32 ('u4')")
        return _Call(function.name, args)

    def build(self, state: Any, target: Any) -> None:
        if isinstance(target, _Call) and target.name.endswith("multiarray._reconstruct"):
            shape = state[1] if isinstance(state, tuple) and len(state) == 5 else None
            if not _is_shape(shape) or math.prod(shape) > NUMPY_MAX_ELEMENTS:
                raise self.refuse(f"holds a numpy array of shape {shape}; the one numpy array a checkpoint may hold "
                                  f"(numpy's legacy RNG key) has at most {NUMPY_MAX_ELEMENTS} elements")

    def storage(self, pid: Any) -> _Storage:
        """A storage's persistent id ``('storage', type, key, location, elements[, view])``: its bytes within the
        record that holds them (zip) or, all storages together, within the file (legacy)."""
        if not (isinstance(pid, tuple) and len(pid) in (5, 6) and pid[0] == "storage" and isinstance(pid[1], _Global)
                and isinstance(pid[2], str) and isinstance(pid[4], int) and pid[4] >= 0):
            raise self.refuse(f"declares a persistent object {str(pid)[:80]} that is not a storage")
        key, elements = pid[2], pid[4]
        kind = pid[1].name.removeprefix("torch.")
        if not kind.endswith("Storage") or pid[1].name not in TORCH_GLOBALS:
            raise _refused(self.what, self.path, pid[1].name)
        nbytes = elements * torch.serialization.StorageType(kind).dtype.itemsize
        if self.records is not None:
            available = self.records.get(key, 0)
        else:
            self.storages[key] = max(nbytes, self.storages.get(key, 0))
            available, nbytes = self.file_budget, sum(self.storages.values())
        if nbytes > available:
            raise self.refuse(f"declares storage {key} of {nbytes:,} bytes, more than the {available:,} bytes the file "
                              "holds for it")
        return _Storage(key, elements)

    def check_view(self, args: tuple) -> None:
        """``_rebuild_tensor_v2(storage, offset, size, stride, ...)``: the view lies within its storage."""
        storage, offset, size, stride = (args + (None,) * 4)[:4]
        if not (isinstance(storage, _Storage) and isinstance(offset, int) and _is_shape(size) and _is_shape(stride)
                and len(size) == len(stride) and offset >= 0):
            raise self.refuse(f"rebuilds a tensor from {str(args)[:80]}, not from a storage, an offset, a shape "
                              "and strides")
        last = offset + sum((s - 1) * st for s, st in zip(size, stride)) if all(size) else -1
        if last >= storage.elements:
            raise self.refuse(f"holds a tensor of shape {tuple(size)} (strides {tuple(stride)}, offset {offset}) "
                              f"over storage {storage.key} of {storage.elements:,} elements")


def _is_shape(value: Any) -> bool:
    return isinstance(value, tuple) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)

