"""NumPy arrays to Arrow and back through their buffers, so that pyarrow never imports pandas.

pyarrow imports pandas (about 0.08 s) the first time it converts an ndarray
(``pa.array``), an Array to NumPy (``to_numpy``, ``np.asarray``) or a Python
value to a scalar, when pandas is installed.  The result tables and the
default exports convert through these helpers instead (issue 14: start-up);
the values are those ``pa.array(values, from_pandas=True)``, ``pa.array``
of a list and ``to_numpy(zero_copy_only=False)`` give.

:data:`pc` is ``pyarrow.compute`` imported on first use (about 0.05 s of
start-up, which a run of a generated workload does not need: issue 34), and
:func:`dictionary_strings` reads a dictionary-encoded string column without it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

#: The Arrow types converted here and their NumPy dtypes.
NUMPY_DTYPES = {
    pa.int8(): np.dtype(np.int8),
    pa.int32(): np.dtype(np.int32),
    pa.int64(): np.dtype(np.int64),
    pa.float64(): np.dtype(np.float64),
}
_ARROW_TYPES = {dtype: arrow for arrow, dtype in NUMPY_DTYPES.items()}


class _Compute:
    """``pyarrow.compute``, imported when one of its functions is first asked for."""

    def __getattr__(self, name: str):
        import pyarrow.compute

        return getattr(pyarrow.compute, name)


#: ``pyarrow.compute``, imported on first use.
pc = _Compute()


def dictionary_strings(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``column.cast(pa.string()).to_pylist()`` of a dictionary-encoded string column without nulls, as an object array.

    Parameters
    ----------
    column : pyarrow.Array or ChunkedArray
        Of a ``pa.dictionary(<integer>, pa.string())`` type.

    Returns
    -------
    ndarray(object)
        Each row's string.
    """
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if array.null_count:
        raise ValueError(f"dictionary_strings: {array.null_count} nulls")
    names = np.array(array.dictionary.to_pylist() + [None], dtype=object)
    if not len(array):
        return np.empty(0, dtype=object)
    indices = array.indices
    codes = np.frombuffer(indices.buffers()[1], dtype=NUMPY_DTYPES[indices.type], count=indices.offset + len(indices))
    return names[codes[indices.offset:]]


def to_arrow(values: np.ndarray, type: pa.DataType | None = None, valid: np.ndarray | None = None) -> pa.Array:
    """``pa.array(values, type=type, mask=~valid, from_pandas=True)`` of a 1-D numeric or boolean ndarray.

    Parameters
    ----------
    values : ndarray(ndim=1)
        int8, int32, int64, float64 or bool values (cast to ``type``'s dtype).
    type : pyarrow.DataType, optional
        One of ``NUMPY_DTYPES`` or ``pa.bool_()``; default: that of ``values``' dtype.
    valid : ndarray(bool, ndim=1), optional
        False where the value is null.  Without it, floats are null where NaN
        (with it, a NaN stays a value, as in ``pa.array``).

    Returns
    -------
    pyarrow.Array
    """
    if type is None:
        type = pa.bool_() if values.dtype == np.bool_ else _ARROW_TYPES[values.dtype]
    n = values.shape[0]
    if type == pa.bool_():
        data = _bitmap(np.asarray(values, dtype=np.bool_))
    else:
        data = np.ascontiguousarray(values, dtype=NUMPY_DTYPES[type])
        if data.dtype.kind == "f" and valid is None:
            valid = ~np.isnan(data)
    null_count = 0 if valid is None else n - int(np.count_nonzero(valid))
    bitmap = _bitmap(valid) if null_count else None
    return pa.Array.from_buffers(type, n, [bitmap, pa.py_buffer(data)], null_count=null_count)


def from_pylist(values: list, type: pa.DataType) -> pa.Array:
    """``pa.array(values, type=type)`` of Python values (None: null) for bool, int, float and string types.

    Other types (lists) go through ``pa.array``.

    Parameters
    ----------
    values : list
        Python values of ``type`` (bool, int, float or str) or None.
    type : pyarrow.DataType

    Returns
    -------
    pyarrow.Array
    """
    valid = np.array([value is not None for value in values], dtype=np.bool_)
    try:
        if type == pa.string():
            encoded = [value.encode() if value is not None else b"" for value in values]
            offsets = np.zeros(len(values) + 1, dtype=np.int32)
            np.cumsum([len(item) for item in encoded], out=offsets[1:])
            null_count = len(values) - int(np.count_nonzero(valid))
            buffers = [_bitmap(valid) if null_count else None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
            return pa.Array.from_buffers(type, len(values), buffers, null_count=null_count)
        if type == pa.bool_() or type in NUMPY_DTYPES:
            dtype = np.bool_ if type == pa.bool_() else NUMPY_DTYPES[type]
            return to_arrow(np.array([value if value is not None else 0 for value in values], dtype=dtype), type, valid)
    except (AttributeError, TypeError, ValueError, OverflowError):
        pass  # not of the type: pa.array converts it or raises its own error
    return pa.array(values, type=type)


def to_numpy(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``column.to_numpy(zero_copy_only=False)`` of a numeric or boolean column, nulls as NaN (floats) or False (bools).

    Parameters
    ----------
    column : pyarrow.Array or ChunkedArray
        Of a type in ``NUMPY_DTYPES`` (no nulls unless float64) or ``pa.bool_()``.

    Returns
    -------
    ndarray(ndim=1)
        A copy.
    """
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n, offset = len(array), array.offset
    bitmap, data = array.buffers()[:2]
    if array.type == pa.bool_():
        values = _unpack(data, offset, n) if n else np.zeros(0, dtype=np.bool_)
        return values & _unpack(bitmap, offset, n) if bitmap is not None and array.null_count else values
    dtype = NUMPY_DTYPES[array.type]
    values = np.frombuffer(data, dtype=dtype, count=offset + n)[offset:].copy() if n else np.zeros(0, dtype)
    if array.null_count:
        if dtype.kind != "f":
            raise ValueError(f"to_numpy: {array.null_count} nulls in a {array.type} column")
        values[~_unpack(bitmap, offset, n)] = np.nan
    return values


def _bitmap(flags: np.ndarray) -> pa.Buffer:
    """Arrow's bit-packed form (least significant bit first) of a boolean ndarray."""
    return pa.py_buffer(np.packbits(flags, bitorder="little"))


def _unpack(buffer: pa.Buffer, offset: int, n: int) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(buffer, dtype=np.uint8), bitorder="little")
    return bits[offset : offset + n].astype(np.bool_)
