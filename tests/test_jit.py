"""simcore.jit.njit: a kernel called with constants by other kernels is compiled once, for the plain types."""

from __future__ import annotations

import numba
from numba import types

from simcore.jit import njit


def _kernels(jit):
    @jit()
    def scaled(x, k):
        return x * (k + 1)

    @jit()
    def by_constants(x):
        return scaled(x, 0) + scaled(x, 2)

    @jit()
    def by_variable(x, k):
        return scaled(x, k)

    return scaled, by_constants, by_variable


def test_constant_arguments_compile_no_version_of_their_own():
    scaled, by_constants, by_variable = _kernels(njit)
    assert by_constants(3) == 3 * 1 + 3 * 3
    assert by_variable(3, 2) == 3 * 3
    assert scaled.signatures == [(types.int64, types.int64)]


def test_numbas_own_njit_compiles_one_version_per_constant():
    # what simcore.jit avoids: the same calls give the callee three versions
    scaled, by_constants, by_variable = _kernels(numba.njit)
    assert by_constants(3) == 12 and by_variable(3, 2) == 9
    assert sorted(map(str, scaled.signatures)) == sorted(
        map(str, [(types.int64, types.literal(0)), (types.int64, types.literal(2)), (types.int64, types.int64)])
    )
