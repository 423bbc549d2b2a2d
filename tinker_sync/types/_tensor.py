"""``TensorData``: a numpy-backed, immutable tensor in the two wire dtypes (int64, float32)."""

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeAlias

from tinker_sync._lazynp import AnyArray, is_ndarray, np_isinstance
from tinker_sync.types._base import TinkerModel

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import torch

__all__ = ["TensorData", "TensorDtype", "check_pad_value", "numpy_dtype_to_tensor_dtype"]

TensorDtype: TypeAlias = Literal["int64", "float32"]

_TENSOR_DTYPES = ("int64", "float32")


def check_pad_value(pad_value: Any) -> int:
    """Return ``pad_value`` as an int; bool, float or anything else raises ``TypeError``."""
    if (
        isinstance(pad_value, bool)
        or np_isinstance(pad_value, "bool_")
        or not (isinstance(pad_value, int) or np_isinstance(pad_value, "integer"))
    ):
        raise TypeError(
            f"pad_value must be an integer, got {type(pad_value).__name__}: {pad_value!r}"
        )
    return int(pad_value)


def numpy_dtype_to_tensor_dtype(dtype: "np.dtype[Any]") -> TensorDtype:
    """Map a numpy dtype to a wire dtype: float kinds -> float32, signed ints -> int64."""
    if dtype.kind == "f":
        return "float32"
    if dtype.kind == "i":
        return "int64"
    raise ValueError(
        f"Unsupported numpy dtype {dtype}: TensorData holds only int64 (signed integer kinds) "
        "and float32 (float kinds)"
    )


def _readonly(arr: AnyArray) -> AnyArray:
    if not arr.flags.writeable:
        return arr
    view: AnyArray = arr.view()
    view.flags.writeable = False
    return view


def _index_array(value: Any, name: str) -> "npt.NDArray[np.int64]":
    import numpy as np

    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iu" or value.ndim != 1:
            raise ValueError(f"TensorData.{name} must be a 1-D integer array")
        return np.ascontiguousarray(value, dtype=np.int64)
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise TypeError(f"TensorData.{name} must be a list of ints, got {type(value).__name__}")
    for i, v in enumerate(value):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"TensorData.{name}[{i}]: expected int, got {type(v).__name__}")
    return np.asarray(value, dtype=np.int64).reshape(-1)


@dataclasses.dataclass(frozen=True, eq=False, init=False, repr=False)
class TensorData(TinkerModel):
    """An int64 or float32 tensor, dense or CSR, stored as a flat read-only numpy array.

    Usage::

        td = TensorData(data=[1, 2, 3], dtype="int64", shape=[3])
        td = TensorData.from_numpy(np.zeros((2, 3), dtype=np.float32))
        td.to_numpy()          # dense view, shape (2, 3)

    Args:
        data: values (list or numpy array); for CSR only the listed values.
        dtype: ``"int64"`` or ``"float32"`` (required).
        shape: dense shape; required for CSR.
        sparse_crow_indices / sparse_col_indices: CSR row pointers and column indices
            (both or neither).

    A frozen stdlib dataclass with the official SDK's fields (``dtype``, ``shape``,
    ``sparse_crow_indices``, ``sparse_col_indices``, ``_numpy``), so ``dataclasses.fields`` and
    ``dataclasses.replace`` work; the index lists are computed from the stored arrays on access.
    A numpy ``data`` array is kept without copying (as in the official SDK); lists are copied.
    Equality is identity (``eq=False``, like the official SDK). Thread safety: immutable, safe
    to share. Fork safety: plain data.
    """

    __slots__ = ("_arr", "_col", "_crow", "_shape", "_view_shape", "dtype")

    if TYPE_CHECKING:  # the storage behind the fields (slots, not dataclass fields)
        _arr: AnyArray
        _shape: list[int] | None
        _crow: npt.NDArray[np.int64] | None
        _col: npt.NDArray[np.int64] | None
        _view_shape: tuple[int, ...]

    dtype: TensorDtype
    # Read from the stored arrays: properties installed after the class (see below).
    shape: list[int] | None = None
    sparse_crow_indices: list[int] | None = None
    sparse_col_indices: list[int] | None = None
    _numpy: AnyArray = None  # type: ignore[assignment]

    _tinker_extra_init: ClassVar[frozenset[str]] = frozenset({"data"})

    def __init__(
        self,
        data: Any = None,
        dtype: TensorDtype | None = None,
        shape: Sequence[int] | None = None,
        sparse_crow_indices: Any = None,
        sparse_col_indices: Any = None,
        _numpy: Any = None,
    ) -> None:
        import numpy as np

        if data is None:
            data = _numpy
        if dtype is None:
            raise TypeError("TensorData requires `dtype` ('int64' or 'float32')")
        if not isinstance(dtype, str) or dtype not in _TENSOR_DTYPES:
            raise ValueError(f"TensorData.dtype must be 'int64' or 'float32', got {dtype!r}")
        np_dtype = np.dtype(dtype)
        if isinstance(data, np.ndarray):
            if data.dtype != np_dtype:
                if data.dtype.kind not in "biuf":
                    raise ValueError(f"TensorData.data: unsupported numpy dtype {data.dtype}")
                arr = data.astype(np_dtype)
            elif not data.flags.writeable:
                arr = data.copy()
            else:
                arr = data
            arr = np.ascontiguousarray(arr)
        elif data is None:
            arr = np.empty(0, dtype=np_dtype)
        else:
            if isinstance(data, (str, bytes)) or not isinstance(data, Sequence):
                raise TypeError(
                    f"TensorData.data must be a list or numpy array, got {type(data).__name__}"
                )
            try:
                arr = np.asarray(data, dtype=np_dtype)
            except (ValueError, TypeError) as exc:
                raise ValueError(
                    f"TensorData.data must be a rectangular list of numbers: {exc}"
                ) from None
        natural_shape = tuple(int(d) for d in arr.shape)
        flat = arr.reshape(-1)

        shape_list: list[int] | None = None
        if shape is not None:
            if isinstance(shape, np.ndarray):
                shape = shape.tolist()
            if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
                raise TypeError(f"TensorData.shape must be a list of ints, got {shape!r}")
            shape_list = []
            for d in shape:
                if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
                    raise TypeError(f"TensorData.shape must be a list of ints, got {shape!r}")
                if d < 0:
                    raise ValueError(f"TensorData.shape has a negative dimension: {shape!r}")
                shape_list.append(int(d))

        crow: npt.NDArray[np.int64] | None = None
        col: npt.NDArray[np.int64] | None = None
        if sparse_crow_indices is not None or sparse_col_indices is not None:
            if sparse_crow_indices is None or sparse_col_indices is None:
                raise ValueError(
                    "TensorData: sparse_crow_indices and sparse_col_indices must be set together"
                )
            if shape_list is None:
                raise ValueError("TensorData: a sparse CSR tensor requires `shape` (dense shape)")
            if len(shape_list) != 2:
                raise ValueError(f"TensorData: CSR shape must be 2-D, got {shape_list}")
            crow = _index_array(sparse_crow_indices, "sparse_crow_indices")
            col = _index_array(sparse_col_indices, "sparse_col_indices")
            rows, cols = shape_list
            if crow.size != rows + 1:
                raise ValueError(
                    f"TensorData.sparse_crow_indices must have {rows + 1} entries, got {crow.size}"
                )
            nnz = flat.size
            if col.size != nnz or (crow.size and (crow[0] != 0 or crow[-1] != nnz)):
                raise ValueError(
                    "TensorData: CSR index lists do not match data "
                    f"({nnz} values, {col.size} column indices, last row pointer "
                    f"{int(crow[-1]) if crow.size else None})"
                )
            if nnz and (int(col.min()) < 0 or int(col.max()) >= cols):
                raise ValueError("TensorData.sparse_col_indices out of range for shape")
            if crow.size > 1 and bool(np.any(np.diff(crow) < 0)):
                raise ValueError("TensorData.sparse_crow_indices must be non-decreasing")
            view_shape: tuple[int, ...] = (nnz,)
        elif shape_list is not None:
            if math.prod(shape_list) != flat.size:
                raise ValueError(
                    f"TensorData: shape {shape_list} does not match {flat.size} values"
                )
            view_shape = tuple(shape_list)
        else:
            view_shape = natural_shape

        set_ = object.__setattr__
        set_(self, "dtype", dtype)
        set_(self, "_shape", shape_list)
        set_(self, "_arr", flat)
        set_(self, "_crow", crow)
        set_(self, "_col", col)
        set_(self, "_view_shape", view_shape)

    def __repr__(self) -> str:
        size = self._arr.size
        preview = self._arr[:8].tolist()
        values = repr(preview)[:-1] + (", ...]" if size > 8 else "]")
        extra = ", sparse=CSR" if self._crow is not None else ""
        return f"TensorData(dtype={self.dtype!r}, shape={self.shape!r}, data={values}{extra})"

    def __reduce__(self) -> tuple[Any, ...]:
        data = self._arr
        if self.shape is None and self._crow is None:
            data = data.reshape(self._view_shape)
        return (_rebuild, (data.copy(), self.dtype, self.shape, self._crow, self._col))

    # -- accessors --------------------------------------------------------------------------
    @property
    def data(self) -> list[Any]:
        """The flattened values as a list (for CSR: only the listed values)."""
        out: list[Any] = self._arr.tolist()
        return out

    @property
    def data_np(self) -> AnyArray:
        """The flat values as a read-only numpy array (int64 or float32), no copy."""
        return _readonly(self._arr)

    @property
    def crow_np(self) -> "npt.NDArray[np.int64] | None":
        """CSR row pointers as a read-only int64 array, or None."""
        return None if self._crow is None else _readonly(self._crow)

    @property
    def col_np(self) -> "npt.NDArray[np.int64] | None":
        """CSR column indices as a read-only int64 array, or None."""
        return None if self._col is None else _readonly(self._col)

    @property
    def is_sparse(self) -> bool:
        """Whether this tensor is stored as CSR."""
        return self._crow is not None

    # -- constructors -----------------------------------------------------------------------
    @classmethod
    def from_numpy(cls, array: AnyArray) -> "TensorData":
        """Wrap a numpy array: float kinds -> float32, signed int kinds -> int64, else ValueError.

        The array is kept without copying when it already has the target dtype, is
        contiguous and writable.
        """
        if not is_ndarray(array):
            raise TypeError(f"from_numpy expects a numpy array, got {type(array).__name__}")
        dtype = numpy_dtype_to_tensor_dtype(array.dtype)
        return cls(data=array, dtype=dtype, shape=list(array.shape))

    @classmethod
    def from_numpy_sparse(cls, array: AnyArray, pad_value: int = 0) -> "TensorData":
        """Like ``from_numpy`` but a 2-D array becomes CSR when that is smaller than dense.

        Entries equal to ``pad_value`` are left out. CSR is used only when
        ``(rows + 1) + 2 * nnz < rows * cols``.
        """
        pad = check_pad_value(pad_value)
        if not is_ndarray(array):
            raise TypeError(f"from_numpy_sparse expects a numpy array, got {type(array).__name__}")
        dtype = numpy_dtype_to_tensor_dtype(array.dtype)
        if array.ndim != 2:
            return cls.from_numpy(array)
        return cls._sparse_from_dense(array, dtype, pad)

    @classmethod
    def _sparse_from_dense(cls, array: AnyArray, dtype: TensorDtype, pad: int) -> "TensorData":
        import numpy as np

        rows, cols = (int(d) for d in array.shape)
        mask = array != pad
        nnz = int(np.count_nonzero(mask))
        if (rows + 1) + 2 * nnz >= rows * cols:
            return cls(data=array, dtype=dtype, shape=[rows, cols])
        values = array[mask]
        counts = np.count_nonzero(mask, axis=1)
        crow = np.zeros(rows + 1, dtype=np.int64)
        np.cumsum(counts, out=crow[1:])
        col = np.nonzero(mask)[1].astype(np.int64)
        return cls(
            data=values,
            dtype=dtype,
            shape=[rows, cols],
            sparse_crow_indices=crow,
            sparse_col_indices=col,
        )

    @classmethod
    def from_torch(cls, tensor: "torch.Tensor") -> "TensorData":
        """Convert a torch tensor (bfloat16 is widened to float32). Requires torch."""
        return cls.from_numpy(_torch_to_numpy(tensor))

    @classmethod
    def from_torch_sparse(cls, tensor: "torch.Tensor", pad_value: int = 0) -> "TensorData":
        """Convert a 2-D torch tensor to CSR when smaller than dense; otherwise ``from_torch``."""
        pad = check_pad_value(pad_value)
        import torch

        if tensor.ndim != 2:
            return cls.from_torch(tensor)
        dtype: TensorDtype = "float32" if tensor.dtype.is_floating_point else "int64"
        arr = _torch_to_numpy(tensor)
        if arr.dtype.kind not in "if":
            arr = arr.astype("int64")
        del torch
        return cls._sparse_from_dense(arr, dtype, pad)

    # -- conversions ------------------------------------------------------------------------
    def to_numpy(self, pad_value: int = 0) -> AnyArray:
        """Return a dense array (read-only for dense tensors; CSR is densified with ``pad_value``)."""
        import numpy as np

        pad = check_pad_value(pad_value)
        if self._crow is None:
            return _readonly(self._arr.reshape(self._view_shape))
        assert self.shape is not None and self._col is not None
        rows, cols = self.shape
        out = np.full((rows, cols), pad, dtype=self._arr.dtype)
        row_idx = np.repeat(np.arange(rows, dtype=np.int64), np.diff(self._crow))
        out[row_idx, self._col] = self._arr
        return out

    def to_torch(self, pad_value: int = 0) -> "torch.Tensor":
        """Return a dense torch tensor (int64 or float32). Requires torch."""
        pad = check_pad_value(pad_value)
        import torch

        if self._crow is None:
            arr = self._arr.reshape(self._view_shape)
            if not arr.flags.writeable:
                arr = arr.copy()
        else:
            arr = self.to_numpy(pad)
        return torch.from_numpy(arr)

    def tolist(self, pad_value: int = 0) -> list[Any]:
        """Return the dense values as nested lists."""
        out: list[Any] = self.to_numpy(pad_value).tolist()
        return out

    # -- model protocol ---------------------------------------------------------------------
    def model_copy(
        self, *, update: Mapping[str, Any] | None = None, deep: bool = False
    ) -> "TensorData":
        """Return a copy with ``update`` applied to the constructor arguments."""
        kwargs: dict[str, Any] = {
            "data": self._arr.copy() if deep else self._arr,
            "dtype": self.dtype,
            "shape": self.shape,
            "sparse_crow_indices": self._crow,
            "sparse_col_indices": self._col,
        }
        if self.shape is None:
            kwargs["data"] = kwargs["data"].reshape(self._view_shape)
        kwargs.update(update or {})
        return TensorData(**kwargs)

    def _tinker_dump(self, json: bool, drop_none: bool, wire: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"data": self._arr.tolist(), "dtype": self.dtype}
        for key, value in (
            ("shape", self.shape),
            ("sparse_crow_indices", self.sparse_crow_indices),
            ("sparse_col_indices", self.sparse_col_indices),
        ):
            if value is not None or not drop_none:
                out[key] = None if value is None else list(value)
        return out


def _shape_list(self: TensorData) -> list[int] | None:
    """The dense shape (required for CSR), or None when built without one."""
    return self._shape


def _crow_list(self: TensorData) -> list[int] | None:
    """CSR row pointers (``rows + 1`` entries) or None for a dense tensor."""
    return None if self._crow is None else self._crow.tolist()


def _col_list(self: TensorData) -> list[int] | None:
    """CSR column indices (one per listed value) or None for a dense tensor."""
    return None if self._col is None else self._col.tolist()


def _numpy_values(self: TensorData) -> AnyArray:
    """The stored values in their natural shape (for CSR: the listed values), read-only."""
    arr = self._arr
    if self.shape is None and self._crow is None:
        arr = arr.reshape(self._view_shape)
    return _readonly(arr)


# Dataclass fields whose values are computed from the stored arrays (so that
# ``dataclasses.fields`` lists the official field names and ``dataclasses.replace`` works).
setattr(TensorData, "shape", property(_shape_list))  # noqa: B010
setattr(TensorData, "sparse_crow_indices", property(_crow_list))  # noqa: B010
setattr(TensorData, "sparse_col_indices", property(_col_list))  # noqa: B010
setattr(TensorData, "_numpy", property(_numpy_values))  # noqa: B010


def _rebuild(
    data: AnyArray,
    dtype: TensorDtype,
    shape: list[int] | None,
    crow: "npt.NDArray[np.int64] | None",
    col: "npt.NDArray[np.int64] | None",
) -> TensorData:
    return TensorData(
        data=data, dtype=dtype, shape=shape, sparse_crow_indices=crow, sparse_col_indices=col
    )


def _torch_to_numpy(tensor: "torch.Tensor") -> AnyArray:
    import torch

    t = tensor.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    if t.device.type != "cpu":
        t = t.cpu()
    arr: AnyArray = t.contiguous().numpy()
    return arr
