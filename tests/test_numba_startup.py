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



RESULTS = """
import hashlib, json, sys
import simcore
from numba.core import base, caching
from simcore import numba_startup
if sys.argv[1] == "refresh":  # numba's own cache load: the whole context refreshed first
    caching.Cache.load_overload = numba_startup.NUMBA_LOAD_OVERLOAD
refreshes = []
numba_refresh = base.BaseContext.refresh
base.BaseContext.refresh = lambda self: refreshes.append(1) or numba_refresh(self)
digest = hashlib.sha256()
for config in ({"workload": {"num_requests": 16}},
               {"workload": {"num_requests": 16}, "engine": {"mode": "disaggregated"}, "output": {"tokens": True}}):
    result = simcore.run(config)
    digest.update(json.dumps(result.summary, sort_keys=True, default=str).encode())
    for table in (result.requests, result.tokens):
        if table is not None:
            digest.update(repr(table.to_pydict()).encode())
print(digest.hexdigest(), bool(refreshes))
"""


def test_cached_kernels_load_without_the_registries_and_give_the_same_results():
    subprocess.run([sys.executable, "-c", RESULTS, "runtime"], check=True, capture_output=True)  # fills the cache
    runs = {how: subprocess.run([sys.executable, "-c", RESULTS, how], capture_output=True, text=True, check=True)
            .stdout.split() for how in ("runtime", "refresh")}
    assert runs["runtime"][0] == runs["refresh"][0]
    assert runs["runtime"][1] == "False" and runs["refresh"][1] == "True"
