"""simcore.arrow_np converts as pyarrow's own conversions do, and never imports pandas."""

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from simcore.arrow_np import from_pylist, to_arrow, to_numpy

FLOATS = np.array([0.5, np.nan, -2.0, 1e300, np.nan, 0.0, 3.25, np.inf, -0.0])
INTS = np.array([3, -1, 0, 2**62, -(2**62), 7, 1, 5, 9], dtype=np.int64)
VALID = np.array([True, False, True, True, False, True, False, True, True])
#: Null where FLOATS is not NaN, and valid where it is: pa.array keeps such a NaN a value.
ACROSS = np.array([False, True, True, True, True, True, False, True, True])


@pytest.mark.parametrize("type_", [pa.int8(), pa.int32(), pa.int64(), pa.float64()])
@pytest.mark.parametrize("valid", [None, VALID, ACROSS, np.ones(9, dtype=bool)])
def test_to_arrow_equals_pa_array(type_, valid):
    values = FLOATS if type_ == pa.float64() else INTS % 100
    mask = None if valid is None else ~valid
    expected = pa.array(values, type=type_, mask=mask, from_pandas=True)
    got = to_arrow(values, type_, valid)
    assert got.type == expected.type and got.null_count == expected.null_count
    assert got.is_valid().to_pylist() == expected.is_valid().to_pylist()
    # NaN equals NaN here (Array.equals says it does not)
    np.testing.assert_array_equal(got.to_numpy(zero_copy_only=False), expected.to_numpy(zero_copy_only=False))


def test_to_arrow_takes_the_type_of_the_dtype_and_packs_booleans():
    assert to_arrow(INTS).equals(pa.array(INTS))
    assert to_arrow(FLOATS).equals(pa.array(FLOATS, from_pandas=True))
    assert to_arrow(VALID).equals(pa.array(VALID))
    assert to_arrow(np.zeros(0, dtype=np.int64)).equals(pa.array(np.zeros(0, dtype=np.int64)))


@pytest.mark.parametrize("array", [
    pa.array(FLOATS, from_pandas=True),
    pa.array(INTS),
    pa.array(VALID),
    pa.array([True, None, False, True], type=pa.bool_()),
    pa.array(INTS.astype(np.int32)),
    pa.chunked_array([pa.array(FLOATS[:4], from_pandas=True), pa.array(FLOATS[4:], from_pandas=True)]),
    pa.array(FLOATS, from_pandas=True).slice(3, 5),
    pa.array(VALID).slice(1, 7),
])
def test_to_numpy_equals_pyarrow(array):
    expected = array.to_numpy(zero_copy_only=False)
    if array.type == pa.bool_():
        expected = np.array([bool(v) for v in array.to_pylist()])
    got = to_numpy(array)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_ints_with_nulls_are_refused():
    with pytest.raises(ValueError, match="nulls"):
        to_numpy(pa.array([1, None], type=pa.int64()))


def test_the_default_run_its_export_and_sweep_columns_do_not_import_pandas():
    code = (
        "import sys, simcore\n"
        "from runners.export import vllm_bench_document\n"
        "result = simcore.run({'workload': {'num_requests': 20}})\n"
        "vllm_bench_document(result, None, detailed=False)\n"
        "from runners.params import id_columns\n"
        "from runners.writer import with_columns\n"
        "with_columns(result.requests, id_columns('point-0', 0, ['load.concurrency'], {'load.concurrency': 4}))\n"
        "print('pandas' in sys.modules, 'scipy.linalg' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("values,type_", [
    (["point-000", None, "é/ü", ""], pa.string()),
    ([3, None, -(2**63), 2**63 - 1], pa.int64()),
    ([0.5, None, float("nan"), 3], pa.float64()),
    ([True, None, False], pa.bool_()),
    ([None, None], pa.int64()),
    ([], pa.string()),
    ([[1, 2], None], pa.list_(pa.int64())),
    ([1.5, 2], pa.int64()),
])
def test_from_pylist_equals_pa_array(values, type_):
    expected = pa.array(values, type=type_)
    got = from_pylist(values, type_)
    assert got.type == expected.type and got.null_count == expected.null_count
    assert got.is_valid().to_pylist() == expected.is_valid().to_pylist()
    assert str(got.to_pylist()) == str(expected.to_pylist())  # nan as 'nan' on both sides


@pytest.mark.parametrize("values,type_", [([2**70], pa.int64()), (["x"], pa.float64()), ([3], pa.string())])
def test_from_pylist_raises_what_pa_array_raises(values, type_):
    with pytest.raises(Exception) as expected:
        pa.array(values, type=type_)
    with pytest.raises(expected.type):
        from_pylist(values, type_)


def test_dictionary_strings_are_pyarrows_cast():
    from simcore.arrow_np import dictionary_strings

    values = ["completed", "rejected", "completed", "incomplete", "rejected"]
    array = pa.array(values).dictionary_encode().cast(pa.dictionary(pa.int8(), pa.string()))
    chunked = pa.chunked_array([array.slice(0, 2), array.slice(2)])
    for column in (array, array.slice(1, 3), chunked, array.slice(0, 0)):
        expected = column.cast(pa.string()).to_pylist()
        got = dictionary_strings(column)
        assert got.dtype == object and got.tolist() == expected


def test_conform_without_a_cast_is_the_cast():
    from simcore.schema import conform

    schema = pa.schema([pa.field("a", pa.int64(), metadata={"unit": "ms"}), pa.field("b", pa.float64())],
                       metadata={"v": "1"})
    same = pa.table({"a": pa.array([1, 2], pa.int64()), "b": pa.array([0.5, None], pa.float64())})
    assert conform(same, schema).equals(same.cast(schema), check_metadata=True)
    other = pa.table({"a": pa.array([1, 2], pa.int32()), "b": pa.array([0.5, None], pa.float64())})
    assert conform(other, schema).equals(other.cast(schema), check_metadata=True)
