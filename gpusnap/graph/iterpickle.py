"""An iterative pickler: standard pickle opcodes (protocol 5), written from an explicit stack.

CPython's C pickler recurses once per level of nesting and gives up past its recursion limit
(on 3.12+ a fixed C limit that ``sys.setrecursionlimit`` does not raise), so a linked structure
100,000 deep cannot be pickled by it at all. ``IterativePickler`` writes the same opcodes the
pure-Python ``pickle._Pickler`` would (memo, tuples that contain themselves through a list,
``__newobj__``/``__newobj_ex__``, list/dict items, state setters), but every "save this child"
is a ``yield`` to a driver loop instead of a call: its depth is bounded by memory, not by the C
stack. The stream loads with the ordinary ``pickle.loads``, whose unpickler is a stack machine.

Reductions come from the caller (``reduce(obj)``: a reduce tuple, a global name, or
``NotImplemented`` for "save by reference"), so the graph pickler's rules (tensors to buffers,
live-only objects) are the same on both paths. It is several times slower than the C pickler, so
the writer uses it only when the C pickler runs out of depth.
"""

from __future__ import annotations

import io
import pickle
import struct
from pickle import (
    ADDITEMS,
    APPEND,
    APPENDS,
    BINFLOAT,
    BINGET,
    BININT,
    BININT1,
    BININT2,
    BINUNICODE,
    BINUNICODE8,
    BUILD,
    BYTEARRAY8,
    EMPTY_DICT,
    EMPTY_LIST,
    EMPTY_SET,
    EMPTY_TUPLE,
    FROZENSET,
    LONG1,
    LONG4,
    LONG_BINGET,
    MARK,
    MEMOIZE,
    NEWFALSE,
    NEWOBJ,
    NEWOBJ_EX,
    NEWTRUE,
    NONE,
    POP,
    POP_MARK,
    PROTO,
    REDUCE,
    SETITEM,
    SETITEMS,
    SHORT_BINBYTES,
    SHORT_BINUNICODE,
    STACK_GLOBAL,
    STOP,
    TUPLE,
    TUPLE1,
    TUPLE2,
    TUPLE3,
)

BINBYTES = pickle.BINBYTES
BINBYTES8 = pickle.BINBYTES8
_BATCH = 1000  # items per APPENDS/SETITEMS, as pickle does
_TUPLE_CODES = {1: TUPLE1, 2: TUPLE2, 3: TUPLE3}
_SINGLETON_TYPES = {type(None): None, type(NotImplemented): NotImplemented, type(...): ...}


class IterativePickler:
    """``IterativePickler(file, reduce).dump(obj)``; ``reduce`` as described in the module doc."""

    def __init__(self, file: io.RawIOBase | io.BufferedIOBase, reduce):
        self._write = file.write
        self._reduce = reduce
        self._memo: dict[int, tuple[int, object]] = {}  # id -> (index, obj): obj keeps the id unique
        self._native = {
            list: self._save_list,
            dict: self._save_dict,
            tuple: self._save_tuple,
            set: self._save_set,
            frozenset: self._save_frozenset,
        }

    def dump(self, obj) -> None:
        self._write(PROTO + b"\x05")
        stack = []
        started = self._save(obj)
        if started is not None:
            stack.append(started)
        while stack:
            try:
                child = next(stack[-1])
            except StopIteration:
                stack.pop()
                continue
            started = self._save(child)
            if started is not None:
                stack.append(started)
        self._write(STOP)

    # -- one object: written at once (atoms, memo hits) or a generator that yields children --
    def _save(self, obj):
        t = type(obj)
        if obj is None:
            self._write(NONE)
        elif t is bool:
            self._write(NEWTRUE if obj else NEWFALSE)
        elif t is int:
            self._save_int(obj)
        elif t is float:
            self._write(BINFLOAT + struct.pack(">d", obj))
        elif id(obj) in self._memo:
            self._get(obj)
        elif t is str:
            self._save_str(obj)
        elif t is bytes:
            self._save_bytes(obj)
        elif t is bytearray:
            self._write(BYTEARRAY8 + struct.pack("<Q", len(obj)) + obj)
            self._memoize(obj)
        elif t in self._native:
            return self._native[t](obj)
        else:
            return self._save_other(obj)
        return None

    def _memoize(self, obj) -> None:
        self._memo[id(obj)] = (len(self._memo), obj)
        self._write(MEMOIZE)

    def _get(self, obj) -> None:
        index = self._memo[id(obj)][0]
        self._write(BINGET + bytes((index,)) if index < 256 else LONG_BINGET + struct.pack("<I", index))

    def _save_int(self, obj: int) -> None:
        if 0 <= obj <= 0xFF:
            self._write(BININT1 + bytes((obj,)))
        elif 0 <= obj <= 0xFFFF:
            self._write(BININT2 + struct.pack("<H", obj))
        elif -0x80000000 <= obj <= 0x7FFFFFFF:
            self._write(BININT + struct.pack("<i", obj))
        else:
            encoded = pickle.encode_long(obj)
            n = len(encoded)
            self._write((LONG1 + bytes((n,)) if n < 256 else LONG4 + struct.pack("<i", n)) + encoded)

    def _save_str(self, obj: str) -> None:
        self._write_sized(SHORT_BINUNICODE, BINUNICODE, BINUNICODE8, obj.encode("utf-8", "surrogatepass"))
        self._memoize(obj)

    def _save_bytes(self, obj: bytes) -> None:
        self._write_sized(SHORT_BINBYTES, BINBYTES, BINBYTES8, obj)
        self._memoize(obj)

    def _write_sized(self, short_op: bytes, op: bytes, long_op: bytes, data: bytes) -> None:
        n = len(data)
        if n < 256:
            self._write(short_op + bytes((n,)) + data)
        elif n <= 0xFFFFFFFF:
            self._write(op + struct.pack("<I", n) + data)
        else:
            self._write(long_op + struct.pack("<Q", n) + data)

    # -- containers ----------------------------------------------------------------------
    def _save_list(self, obj: list):
        self._write(EMPTY_LIST)
        self._memoize(obj)
        yield from self._appends(iter(obj))

    def _appends(self, items):
        for batch in _batches(items):
            if len(batch) == 1:
                yield batch[0]
                self._write(APPEND)
                continue
            self._write(MARK)
            for item in batch:
                yield item
            self._write(APPENDS)

    def _save_dict(self, obj: dict):
        self._write(EMPTY_DICT)
        self._memoize(obj)
        yield from self._setitems(iter(obj.items()))

    def _setitems(self, items):
        for batch in _batches(items):
            if len(batch) == 1:
                yield batch[0][0]
                yield batch[0][1]
                self._write(SETITEM)
                continue
            self._write(MARK)
            for key, value in batch:
                yield key
                yield value
            self._write(SETITEMS)

    def _save_set(self, obj: set):
        self._write(EMPTY_SET)
        self._memoize(obj)
        for batch in _batches(iter(list(obj))):
            self._write(MARK)
            for item in batch:
                yield item
            self._write(ADDITEMS)

    def _save_frozenset(self, obj: frozenset):
        self._write(MARK)
        for item in obj:
            yield item
        if id(obj) in self._memo:  # reached itself through its items: drop what was built
            self._write(POP_MARK)
            self._get(obj)
            return
        self._write(FROZENSET)
        self._memoize(obj)

    def _save_tuple(self, obj: tuple):
        if not obj:
            self._write(EMPTY_TUPLE)
            return
        n = len(obj)
        if n > 3:
            self._write(MARK)
        for item in obj:
            yield item
        if id(obj) in self._memo:  # a tuple that contains itself through a mutable object
            self._write(POP * n if n <= 3 else POP_MARK)
            self._get(obj)
            return
        self._write(_TUPLE_CODES.get(n, TUPLE))
        self._memoize(obj)

    # -- everything else: by reference, or by its reduction --------------------------------
    def _save_other(self, obj):
        rv = self._reduce(obj)
        if rv is NotImplemented:
            if type(obj) is type and obj in _SINGLETON_TYPES:  # type(None) has no importable name
                return self._save_reduce(obj, (type, (_SINGLETON_TYPES[obj],)))
            return self._save_global(obj)
        if isinstance(rv, str):
            return self._save_global(obj, rv)
        return self._save_reduce(obj, rv)

    def _save_global(self, obj, name: str | None = None):
        module = getattr(obj, "__module__", None)
        qualname = name or getattr(obj, "__qualname__", None) or obj.__name__
        if module is None:
            module = pickle.whichmodule(obj, qualname)
        yield module
        yield qualname
        self._write(STACK_GLOBAL)
        self._memoize(obj)

    def _save_reduce(self, obj, rv: tuple):
        func, args, state, listitems, dictitems, state_setter = (tuple(rv) + (None,) * 6)[:6]
        func_name = getattr(func, "__name__", "")
        if func_name == "__newobj_ex__":
            cls, cls_args, kwargs = args
            yield cls
            yield tuple(cls_args)
            yield kwargs
            self._write(NEWOBJ_EX)
        elif func_name == "__newobj__":
            yield args[0]
            yield tuple(args[1:])
            self._write(NEWOBJ)
        else:
            yield func
            yield args
            self._write(REDUCE)
        if id(obj) in self._memo:  # its arguments reached it: use the one they built
            self._write(POP)
            self._get(obj)
        else:
            self._memoize(obj)
        if listitems is not None:
            yield from self._appends(listitems)
        if dictitems is not None:
            yield from self._setitems(dictitems)
        if state is not None:
            if state_setter is None:
                yield state
                self._write(BUILD)
            else:
                yield state_setter
                yield obj
                yield state
                self._write(TUPLE2 + REDUCE + POP)


def _batches(items):
    """Lists of up to ``_BATCH`` items, as pickle groups APPENDS, SETITEMS and ADDITEMS."""
    while True:
        batch = [item for _, item in zip(range(_BATCH), items)]
        if not batch:
            return
        yield batch
