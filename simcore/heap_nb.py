"""Binary min-heaps over (key, value) int64 pairs, shared by the engine and the client stage.

Contract: ``@njit(cache=True)`` kernels over caller-allocated ``keys`` and
``vals`` arrays and a size; ties on the key are broken by the value, so pops
follow a total order (STYLE 7).  Below every stage: it imports nothing of the
simulator.
"""

from __future__ import annotations

from numba import njit


@njit(cache=True, inline="always")
def heap_push_nb(keys, vals, size, key, val):
    """Push (key, val) on a min-heap ordered by (key, val).

    Parameters
    ----------
    keys, vals : ndarray(int64, ndim=1)
        The heap's keys (e.g. instants, ns) and values, room for one more; updated.
    size : int
        Entries in the heap.
    key, val : int
        The new entry.

    Returns
    -------
    int
        The new size.
    """
    i = size
    keys[i] = key
    vals[i] = val
    while i > 0:
        parent = (i - 1) >> 1
        if keys[parent] < keys[i] or (keys[parent] == keys[i] and vals[parent] <= vals[i]):
            break
        keys[parent], keys[i] = keys[i], keys[parent]
        vals[parent], vals[i] = vals[i], vals[parent]
        i = parent
    return size + 1


@njit(cache=True, inline="always")
def heap_pop_nb(keys, vals, size):
    """Remove the top of the heap (the smallest (key, val)).

    Parameters
    ----------
    keys, vals : ndarray(int64, ndim=1)
        The heap; updated.
    size : int
        Entries in the heap, >= 1.

    Returns
    -------
    int
        The new size.
    """
    size -= 1
    keys[0] = keys[size]
    vals[0] = vals[size]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= size:
            break
        child = left
        right = left + 1
        if right < size and (
            keys[right] < keys[left] or (keys[right] == keys[left] and vals[right] < vals[left])
        ):
            child = right
        if keys[i] < keys[child] or (keys[i] == keys[child] and vals[i] <= vals[child]):
            break
        keys[child], keys[i] = keys[i], keys[child]
        vals[child], vals[i] = vals[i], vals[child]
        i = child
    return size
