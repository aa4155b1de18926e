"""simcore.numba_startup: a run loads neither scipy.linalg nor cffi's parser, and numba's BLAS and cffi support still work."""

import subprocess
import sys

CODE = """
import sys
import numpy as np
import numba
import simcore
simcore.run({"workload": {"num_requests": 8}})
print("scipy.linalg" in sys.modules, "pycparser" in sys.modules)

@numba.njit
def dot(a):
    return np.dot(a, a)

print(dot(np.arange(4.0)), "scipy.linalg" in sys.modules)
import cffi
from numba.core.typing import cffi_utils
ffi = cffi.FFI()
ffi.cdef("double sqrt(double);")
lib = ffi.dlopen(None)
print(cffi_utils.is_cffi_func(lib.sqrt), cffi_utils.is_ffi_instance(ffi))
"""


def test_a_run_defers_them_and_numba_still_has_blas_and_cffi():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:3] == ["False False", "14.0 True", "True True"]
