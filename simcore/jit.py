"""``njit`` for simcore's kernels: numba's, compiling one version of a kernel per argument type.

When a jitted function calls another with a constant (``f(x, 0)``, a module
constant such as ``LINEAR_NUM_PARAMS``, or a variable still holding the
constant it was assigned), numba types that argument as a literal
(``Literal[int](0)``) and compiles a version of the callee for that value,
and for its callees in turn: about a fifth of the kernels' cold compile time
went to such copies of code already compiled for ``int64``.  Kernels made by
this ``njit`` are typed on the arguments' plain types instead; a constant
converts to it as in any call, so the code run is the same.  A kernel that
needs a literal argument (to index a heterogeneous tuple, say) cannot be
made with it.
"""

from __future__ import annotations

from numba.core import types
from numba.core.registry import CPUDispatcher


class Kernel(CPUDispatcher):
    """numba's CPU dispatcher, typing calls from other kernels on non-literal argument types."""

    def get_call_template(self, args, kws):
        return super().get_call_template(
            tuple(types.unliteral(a) for a in args), {k: types.unliteral(v) for k, v in kws.items()}
        )


def njit(*, cache: bool = False, **options):
    """``numba.njit(cache=..., **options)`` (keyword options only) making a :class:`Kernel`.

    Parameters
    ----------
    cache : bool
        Cache the compiled versions on disk (``simcore.jit_cache``).
    **options
        numba's CPU target options (``inline``, ``nogil``, ``parallel``, ...).

    Returns
    -------
    callable
        The decorator: a Python function in, its :class:`Kernel` out.
    """

    def wrap(function):
        kernel = Kernel(py_func=function, locals={}, targetoptions={**options, "nopython": True, "boundscheck": None})
        if cache:
            kernel.enable_caching()
        return kernel

    return wrap
