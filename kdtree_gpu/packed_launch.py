"""Kernel launches with their parameters packed into one block, through the driver.

CuPy's ``RawKernel`` call inspects every argument at each launch (9-17 us
of host time for the traversal's six parameters, measured on H200
machines); a launch whose host time matters (a ray query: a few
microseconds of GPU work for a small batch) declares its parameter list
once, as :class:`PackedLaunch` (read from the kernel's definition in its
``.cu`` file by :meth:`PackedLaunch.of_kernel`), and costs one
``struct.pack_into`` and one ``cuLaunchKernel`` (4-5 us).
:class:`BoundLaunch` packs the values that never change (a tree's
addresses) once. Descriptions, the profiler and the debug switch are
:mod:`kdtree_gpu.launch`'s.
"""

from __future__ import annotations

import importlib
import struct
import sys
import threading
from typing import Sequence

import numpy as np

from . import launch as _launch

# struct module codes of the scalar types kernel parameters are made of
_STRUCT_CODES = {
    np.dtype(np.float32): "f", np.dtype(np.float64): "d", np.dtype(np.int8): "b",
    np.dtype(np.uint8): "B", np.dtype(np.bool_): "?", np.dtype(np.int32): "i",
    np.dtype(np.uint32): "I", np.dtype(np.int64): "q", np.dtype(np.uint64): "Q",
}


def _struct_format(dtype: np.dtype) -> str:
    """The :mod:`struct` format of an aligned NumPy dtype: its scalars in offset order, padding as ``x``."""
    parts, at = [], 0
    for name, (field, offset) in sorted(dtype.fields.items(), key=lambda item: item[1][1]):
        parts.append("x" * (offset - at))
        parts.append(_struct_format(field) if field.fields else _STRUCT_CODES[field])
        at = offset + field.itemsize
    parts.append("x" * (dtype.itemsize - at))
    return "".join(parts)


# CuPy's binding of the driver API; looked up in sys.modules at each launch
# (an import statement costs a microsecond there)
_DRIVER = "cupy_backends.cuda.api.driver"


class PackedLaunch:
    """A kernel's parameter list packed into one block and launched through the driver.

    CuPy's ``RawKernel`` call inspects every argument at each launch (9 us of
    host time for the traversal's six parameters on an H200 machine, where
    ``cuLaunchKernel`` itself takes 4 us); a query that is one launch wants
    less. Here the parameter list is declared once, in the kernel's order,
    each parameter a NumPy scalar dtype (a pointer is ``uint64``) or a class
    whose generated C struct the kernel takes by value
    (:class:`kdtree_gpu.soa.ScalarStruct`, :class:`kdtree_gpu.soa.SoA`). A
    launch packs the values, flattened in that order (struct fields in
    declaration order, ``0`` for a null pointer), with one
    ``struct.pack_into`` into a block of this thread and hands
    ``cuLaunchKernel`` the address of each parameter in it; the driver copies
    the parameters at the call, so the block is free again when it returns.

    Parameters
    ----------
    kernel_name : str
        For error messages.
    parameters : sequence of (name, type)
    """

    def __init__(self, kernel_name: str, parameters: Sequence):
        from .soa import struct_dtype

        self.name = kernel_name
        self.parameters = tuple(parameters)

        def dtype(kind):
            scalar = isinstance(kind, np.dtype) or (isinstance(kind, type)
                                                    and issubclass(kind, np.generic))
            return np.dtype(kind) if scalar else struct_dtype(kind)

        block = np.dtype([(name, dtype(kind)) for name, kind in parameters], align=True)
        self._struct = struct.Struct("<" + _struct_format(block))
        if self._struct.size != block.itemsize:
            raise AssertionError(f"{kernel_name}: packed parameters take {self._struct.size} "
                                 f"bytes, the aligned block {block.itemsize}")
        self._offsets = np.array([block.fields[name][1] for name, _ in parameters], np.uint64)
        self._local = threading.local()  # a launch may release the GIL: one block per thread
        self._splits = {}  # number of fixed values -> (head, tail) Structs (bound launches)

    @classmethod
    def of_kernel(cls, filename: str, name: str, structs=()) -> "PackedLaunch":
        """The parameter list of kernel ``name`` as ``kdtree_gpu/cuda/<filename>`` defines it.

        Pointers become addresses, C scalars their NumPy types
        (:data:`kdtree_gpu.soa.C_TYPES`), and a struct taken by value the class
        among ``structs`` whose generated C struct has that name; the list is
        then declared once, in the CUDA source.

        Raises
        ------
        ValueError
            A parameter type that is none of these.
        """
        from .kernels import kernel_parameters
        from .soa import C_TYPES

        scalars = {c_type: dtype for dtype, c_type in C_TYPES.items()}
        by_name = {struct.c_name: struct for struct in structs}
        parameters = []
        for param, c_type, pointer in kernel_parameters(filename, name):
            kind = np.dtype(np.uint64) if pointer else scalars.get(c_type, by_name.get(c_type))
            if kind is None:
                raise ValueError(f"{name} in {filename}: parameter {param!r} has type {c_type!r}, "
                                 f"neither a pointer, a scalar nor one of the structs given")
            parameters.append((param, kind))
        return cls(name, parameters)

    def _new_block(self) -> tuple:
        data = np.zeros(self._struct.size, np.uint8)
        pointers = self._offsets + np.uint64(data.ctypes.data)
        # the arrays stay referenced with the address, so it stays valid
        return data, pointers, pointers.ctypes.data

    def _block(self):
        blocks = self._local.__dict__.get("blocks")
        if blocks is None:
            blocks = self._local.blocks = self._new_block()
        return blocks

    def __call__(self, description: str, function: int, n: int, block: int, values: tuple,
                 stream: int) -> None:
        """Launch ``ceil(n / block)`` blocks of ``function`` (a ``CUfunction``) on ``stream``.

        ``n`` is a host integer (``0``: nothing is launched); errors raise
        :class:`LaunchError` naming ``description``; the active profiler and
        the debug switch apply as in :func:`launch`.
        """
        data, _, address = self._block()
        self._launch(description, function, n, block, stream, data, address, self._struct, 0,
                     values)

    def _launch(self, description, function, n, block, stream, data, address, packer, at,
                values) -> None:
        """Pack ``values`` with ``packer`` at byte ``at`` of ``data`` and launch."""
        if n <= 0:
            return
        driver = sys.modules.get(_DRIVER) or importlib.import_module(_DRIVER)
        grid = (n + block - 1) // block
        if _launch._active_profiler is None and not _launch._debug:
            try:
                packer.pack_into(data, at, *values)
                driver.launchKernel(function, grid, 1, 1, block, 1, 1, 0, stream, address, 0)
                return
            except Exception as exc:
                raise _launch._launch_error(description, self, n, grid, block, exc) from exc

        def call():
            packer.pack_into(data, at, *values)
            driver.launchKernel(function, grid, 1, 1, block, 1, 1, 0, stream, address, 0)

        _launch._observed(description, self, n, grid, block, call)

    def bound(self, head: tuple) -> "BoundLaunch":
        """This launch with its first ``len(head)`` values fixed (:class:`BoundLaunch`)."""
        return BoundLaunch(self, head)

    def _split(self, count: int) -> tuple:
        """``(head Struct, tail Struct)``: the first ``count`` values (with the padding
        after them) and the rest."""
        split = self._splits.get(count)
        if split is None:
            codes, seen = self._struct.format.lstrip("<"), 0
            for at, code in enumerate(codes):
                if code != "x":
                    if seen == count:
                        break
                    seen += 1
            else:
                at = len(codes)
            if seen < count:
                raise ValueError(f"{self.name}: {count} fixed values, the block holds {seen}")
            split = self._splits[count] = (struct.Struct("<" + codes[:at]),
                                           struct.Struct("<" + codes[at:]))
        return split

    @property
    def offsets(self) -> tuple:
        """Where each parameter starts in the block (bytes)."""
        return tuple(int(x) for x in self._offsets)

    def pack(self, values: tuple) -> np.ndarray:
        """A new block (uint8) holding ``values``, padding zero."""
        data = np.zeros(self._struct.size, np.uint8)
        self._struct.pack_into(data, 0, *values)
        return data

    def prepared(self, function: int, n: int, block: int, values: tuple, stream: int):
        """A callable that launches with these values, packed now into a block of its own.

        For timing the kernel alone: each call is one ``cuLaunchKernel``.
        """
        from cupy_backends.cuda.api import driver

        data, pointers, address = self._new_block()
        self._struct.pack_into(data, 0, *values)
        grid = (n + block - 1) // block

        def call():
            driver.launchKernel(function, grid, 1, 1, block, 1, 1, 0, stream, address, 0)

        call.arrays = (data, pointers)  # alive as long as the callable: the addresses stay valid
        return call


class BoundLaunch:
    """A :class:`PackedLaunch` whose first values never change, packed once.

    A tree's query launches with the same addresses and box every time:
    they are packed once into each thread's block, and a launch packs only
    the values after them. The block of the thread that binds is made here
    (a GPU build binds its tree's launch, so that the tree's first query
    there makes nothing); another thread's at its first launch. Call as the
    launch itself, with those values only.
    """

    def __init__(self, launch: PackedLaunch, head: tuple):
        self.launch = launch
        self.head = tuple(head)
        self._head, self._tail = launch._split(len(self.head))
        self._local = threading.local()
        self._block()

    def _block(self):
        blocks = self._local.__dict__.get("blocks")
        if blocks is None:
            blocks = self.launch._new_block()
            self._head.pack_into(blocks[0], 0, *self.head)
            self._local.blocks = blocks
        return blocks

    def __call__(self, description: str, function: int, n: int, block: int, values: tuple,
                 stream: int) -> None:
        data, _, address = self._block()
        self.launch._launch(description, function, n, block, stream, data, address, self._tail,
                            self._head.size, values)
