"""Tensors and ops for custom models: `Data` (a host tensor) and `run(op, tensors, floats, ints)`.

>>> from fastllm import ops
>>> x = ops.Data.from_list([1.0, 2.0, 3.0])
>>> y = ops.Data.from_list([10.0, 20.0, 30.0])
>>> ops.run("AddTo", {"input0": x, "input1": y}, floats={"alpha": 0.5})
>>> x.to_list()
[6.0, 12.0, 18.0]
"""

from __future__ import annotations

import ctypes
import struct
from typing import Dict, List, Optional, Sequence

from . import FastllmError, _BUFFER_TOO_SMALL, _check, _L

F32, BF16, INT8, INT4, F16, INT4_MIN, INT32 = 0, 1, 3, 4, 7, 8, 13


class Data:
    """A host tensor owned by the library."""

    def __init__(self, dtype: int, dims: Sequence[int], data: Optional[bytes] = None):
        d = (ctypes.c_int64 * len(dims))(*dims)
        h = ctypes.c_void_p()
        if data is None:
            _check(_L.fastllm_data_new(dtype, d, len(dims), None, 0, ctypes.byref(h)))
        else:
            _check(_L.fastllm_data_new(dtype, d, len(dims), data, len(data), ctypes.byref(h)))
        self._h = h
        self.dtype = dtype

    @classmethod
    def from_list(cls, values: Sequence[float], dims: Optional[Sequence[int]] = None) -> "Data":
        """An f32 tensor from values (1-D unless dims are given)."""
        dims = list(dims) if dims is not None else [len(values)]
        return cls(F32, dims, struct.pack(f"<{len(values)}f", *values))

    @classmethod
    def from_ints(cls, values: Sequence[int], dims: Optional[Sequence[int]] = None) -> "Data":
        """An int32 tensor from values."""
        dims = list(dims) if dims is not None else [len(values)]
        return cls(INT32, dims, struct.pack(f"<{len(values)}i", *values))

    @classmethod
    def empty(cls, dtype: int = F32) -> "Data":
        """A 0-element tensor, e.g. an op output that the op will size."""
        return cls(dtype, [0])

    def __del__(self):
        if getattr(self, "_h", None):
            _L.fastllm_data_free(self._h)
            self._h = None

    @property
    def shape(self) -> List[int]:
        n = ctypes.c_size_t()
        st = _L.fastllm_data_shape(self._h, None, 0, ctypes.byref(n))
        if st not in (0, _BUFFER_TOO_SMALL):
            _check(st)
        arr = (ctypes.c_int64 * max(1, n.value))()
        _check(_L.fastllm_data_shape(self._h, arr, n.value, ctypes.byref(n)))
        return list(arr[: n.value])

    def to_bytes(self) -> bytes:
        n = ctypes.c_size_t()
        st = _L.fastllm_data_read(self._h, None, 0, ctypes.byref(n))
        if st not in (0, _BUFFER_TOO_SMALL):
            _check(st)
        buf = ctypes.create_string_buffer(max(1, n.value))
        _check(_L.fastllm_data_read(self._h, buf, n.value, ctypes.byref(n)))
        return buf.raw[: n.value]

    def to_list(self) -> list:
        """Values of an f32 or int32 tensor, flattened."""
        b = self.to_bytes()
        if self.dtype == F32:
            return list(struct.unpack(f"<{len(b) // 4}f", b))
        if self.dtype == INT32:
            return list(struct.unpack(f"<{len(b) // 4}i", b))
        raise FastllmError(2, "to_list supports f32 and int32 tensors; use to_bytes")


def run(op: str, tensors: Dict[str, Data], floats: Optional[Dict[str, float]] = None,
        ints: Optional[Dict[str, int]] = None) -> None:
    """Runs `op` (see docs/ops.md) on named tensors; outputs are resized in place."""
    floats = floats or {}
    ints = ints or {}
    names = [k.encode() for k in tensors]
    n_arr = (ctypes.c_char_p * max(1, len(names)))(*names)
    d_arr = (ctypes.c_void_p * max(1, len(names)))(*[t._h.value for t in tensors.values()])
    fn = [k.encode() for k in floats]
    fn_arr = (ctypes.c_char_p * max(1, len(fn)))(*fn)
    fv = (ctypes.c_float * max(1, len(fn)))(*floats.values())
    iname = [k.encode() for k in ints]
    in_arr = (ctypes.c_char_p * max(1, len(iname)))(*iname)
    iv = (ctypes.c_int32 * max(1, len(iname)))(*ints.values())
    _check(_L.fastllm_op_run(op.encode(), n_arr, ctypes.cast(d_arr, ctypes.POINTER(ctypes.c_void_p)), len(names),
                             fn_arr, fv, len(fn), in_arr, iv, len(iname)))


def profiler_report() -> str:
    """The per-op profile of `run` calls."""
    n = ctypes.c_size_t()
    st = _L.fastllm_profiler_report(None, 0, ctypes.byref(n))
    if st not in (0, _BUFFER_TOO_SMALL):
        _check(st)
    buf = ctypes.create_string_buffer(n.value + 1)
    _check(_L.fastllm_profiler_report(buf, len(buf), ctypes.byref(n)))
    return buf.raw[: n.value].decode()
