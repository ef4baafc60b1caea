"""Structures of arrays declared once: allocation, views, kernel arguments, C structs.

A structure of arrays (SoA) is a dataclass whose fields are declared with
:func:`soa_field`: dtype, optional row width, and the row count as a linear
function of the SoA's size ``n`` (``rows = scale * n + extra``). From that
one declaration come

* :meth:`SoA.allocate`, :meth:`SoA.take`, :meth:`SoA.prefix`: all fields
  together (pbrt-v4's generated SoA code, Warp's ``<entity>_<attribute>``
  arrays);
* :meth:`SoA.args`: the fields in declaration order, for kernels that take
  them as separate parameters;
* the C struct the kernels see (:func:`cuda_struct`, one pointer per field,
  in declaration order) and :meth:`SoA.struct`, the matching by-value
  kernel argument (a one-element NumPy structured array of device
  addresses, which CuPy passes by value). The struct layouts reach the CUDA
  sources through the generated preamble (:func:`kdtree_gpu.kernels.read_source`),
  with ``static_assert`` checks of every offset, so a layout that differs
  from the NumPy dtype fails to compile (also in CI's nvcc check).

Plain structs of scalars (sizes, settings) are declared with
:class:`ScalarStruct` and reach CUDA the same way.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import numpy as np

# NumPy dtype -> C type of the fields
C_TYPES = {
    np.dtype(np.float32): "float", np.dtype(np.float64): "double",
    np.dtype(np.int8): "signed char", np.dtype(np.uint8): "unsigned char",
    np.dtype(np.bool_): "bool", np.dtype(np.int32): "int", np.dtype(np.uint32): "unsigned int",
    np.dtype(np.int64): "long long", np.dtype(np.uint64): "unsigned long long",
}


def soa_field(dtype, width: Optional[int] = None, scale: int = 1, extra: int = 0):
    """Declare one SoA field of ``scale * n + extra`` rows (``(rows,)`` or ``(rows, width)``)."""
    return dataclasses.field(metadata={"dtype": np.dtype(dtype), "width": width,
                                       "scale": scale, "extra": extra})


class SoA:
    """Helpers shared by every structure of arrays.

    Subclasses are dataclasses whose fields are all :func:`soa_field`.
    ``c_name`` names the generated C struct (``None``: no struct);
    ``live_field`` names the field that says whether a row is live (for
    compaction: a uint8 field is live where nonzero, a float32 one where > 0).
    """

    c_name: Optional[str] = None
    live_field: Optional[str] = None

    @classmethod
    def shapes(cls, n: int, **rows) -> dict:
        """``{field name: (shape, dtype)}`` of an SoA of size ``n``.

        ``rows`` overrides the row count of single fields by name.
        """
        shapes = {}
        for f in _fields(cls):
            m = f.metadata
            count = rows.get(f.name, m["scale"] * n + m["extra"])
            shapes[f.name] = ((count,) if m["width"] is None else (count, m["width"]), m["dtype"])
        return shapes

    @classmethod
    def allocate(cls, xp, n: int, zero: bool = False, **rows):
        """An SoA of size ``n`` on the backend of ``xp``.

        ``rows`` overrides the row count of single fields by name. (Arrays
        cut from one block: :class:`kdtree_gpu.builder.gpu.workspace.BlockLayout`.)
        """
        make = xp.zeros if zero else xp.empty
        return cls(**{name: make(shape, dtype=dtype)
                      for name, (shape, dtype) in cls.shapes(n, **rows).items()})

    def take(self, index):
        """A new SoA holding rows ``index`` (an int array) of every field, in that order."""
        return type(self)(**{f.name: getattr(self, f.name)[index] for f in _fields(type(self))})

    def prefix(self, n: int):
        """A view of the first ``n`` rows of every field (no copy; same scale for every
        field; a field that is ``None`` stays ``None``)."""
        def rows(f):
            a = getattr(self, f.name)
            return None if a is None else a[:f.metadata["scale"] * n + f.metadata["extra"]]

        return type(self)(**{f.name: rows(f) for f in _fields(type(self))})

    @property
    def size(self) -> int:
        """``n``: the rows of the first field (which has scale 1, extra 0)."""
        return int(getattr(self, field_names(type(self))[0]).shape[0])

    def arrays(self) -> dict:
        """``{field name: array}`` in declaration order."""
        return {name: getattr(self, name) for name in field_names(type(self))}

    def args(self) -> tuple:
        """The fields in declaration order: the kernel parameters of this SoA."""
        return tuple(getattr(self, name) for name in field_names(type(self)))

    def struct(self):
        """The by-value kernel argument: device addresses in the layout of :func:`cuda_struct`.

        Every field is one 8-byte pointer, so the struct is the addresses in
        declaration order (no padding), handed over as opaque bytes
        (:func:`as_kernel_argument`).
        """
        return type(self).struct_of_addresses(self.addresses())

    def addresses(self) -> list:
        """The fields' addresses in declaration order (``0`` for ``None``): the struct's values."""
        return [_address(getattr(self, name)) for name in field_names(type(self))]

    @classmethod
    def struct_of_addresses(cls, addresses):
        """The by-value kernel struct of fields at these device addresses (declaration order)."""
        return np.asarray(addresses, dtype=np.uint64).view(_bytes_dtype(cls))

    @classmethod
    def of(cls, **arrays):
        """An instance with the given fields and ``None`` (null) for the others."""
        return cls(**{name: arrays.get(name) for name in field_names(cls)})


class ScalarStruct:
    """A C struct of scalars (sizes, settings) passed by value to a kernel.

    Subclasses are dataclasses with a ``c_name`` and fields declared with
    :func:`scalar_field`; :meth:`struct` gives the kernel argument.
    """

    c_name: str = ""

    def struct(self):
        """The by-value kernel argument (opaque bytes in the struct's layout)."""
        return as_kernel_argument(self.fields())

    def fields(self):
        """The values as a one-element NumPy structured array of :func:`struct_dtype`."""
        cls = type(self)
        value = np.zeros(1, dtype=struct_dtype(cls))  # padding bytes zero, not garbage
        value[0] = tuple(getattr(self, name) for name in field_names(cls))
        return value


def scalar_field(dtype, default=dataclasses.MISSING):
    """Declare one scalar field of a :class:`ScalarStruct`."""
    return dataclasses.field(default=default, metadata={"dtype": np.dtype(dtype)})


def _is_soa(cls) -> bool:
    return isinstance(cls, type) and issubclass(cls, SoA)


# dataclasses.fields builds its tuple at every call; the builder asks
# dozens of times per build for the same few classes
@functools.lru_cache(maxsize=None)
def _fields(cls) -> tuple:
    return dataclasses.fields(cls)


@functools.lru_cache(maxsize=None)
def field_names(cls) -> tuple:
    """The names of a struct's or SoA's fields, in declaration order (the C order)."""
    return tuple(f.name for f in _fields(cls))


def as_kernel_argument(fields) -> np.ndarray:
    """A one-element structured array as the by-value kernel argument CuPy takes.

    CuPy passes a one-element NumPy array by value, reading its address
    through ``__array_interface__``; for a structured dtype NumPy describes
    every field there again at each call (about ten microseconds an
    argument), so the same bytes go as one opaque ``V<n>`` element.
    """
    return fields.view(np.dtype((np.void, fields.dtype.itemsize)))


@functools.lru_cache(maxsize=None)
def _bytes_dtype(cls) -> np.dtype:
    return np.dtype((np.void, struct_dtype(cls).itemsize))


@functools.lru_cache(maxsize=None)
def struct_dtype(cls) -> np.dtype:
    """The aligned NumPy dtype of ``cls``'s C struct (pointers are uint64 addresses)."""
    pointer = _is_soa(cls)
    return np.dtype([(f.name, np.uint64 if pointer else f.metadata["dtype"])
                     for f in dataclasses.fields(cls)], align=True)


def cuda_struct(cls) -> str:
    """C declaration of ``cls``'s struct, with ``static_assert`` checks of its layout.

    SoA fields become pointers to their element type; scalar fields keep
    their type. Field order is declaration order.
    """
    dtype = struct_dtype(cls)
    pointer = _is_soa(cls)
    lines = [f"struct {cls.c_name} {{"]
    for f in dataclasses.fields(cls):
        c_type = C_TYPES[f.metadata["dtype"]]
        lines.append(f"    {c_type}{'*' if pointer else ''} {f.name};")
    lines.append("};")
    lines.append(f"static_assert(sizeof({cls.c_name}) == {dtype.itemsize}, "
                 f"\"{cls.c_name}: size differs from its NumPy dtype\");")
    # NVRTC has no offsetof; nvcc (CI's check of every source) checks the offsets
    lines.append("#ifndef __CUDACC_RTC__")
    for f in dataclasses.fields(cls):
        lines.append(f"static_assert(__builtin_offsetof({cls.c_name}, {f.name}) == "
                     f"{dtype.fields[f.name][1]}, \"{cls.c_name}.{f.name}: offset differs\");")
    lines.append("#endif")
    return "\n".join(lines) + "\n"


def _address(a) -> int:
    # None is a null pointer: a field the kernel does not use
    if a is None:
        return 0
    return int(a.ctypes.data) if isinstance(a, np.ndarray) else int(a.data.ptr)
