"""Allocation of the per-token arrays (docs/performance.md, "Huge pages").

NumPy advises transparent huge pages for every large array.  That makes the
first touch of an array cheaper per element, but a detailed run whose
per-token arrays reach gigabytes spent longer end to end with the advice than
without it (1,000,000 requests of 1024/128 tokens, 1 GB per array: 11.6 s against 9.6
s), while at 400,000 (410 MB per array) the two were even,
the kernel stalling on huge-page compaction.  So an array of at least
``NO_HUGEPAGE_BYTES`` is mapped on its own, advised against huge pages.
"""

from __future__ import annotations

import mmap

import numpy as np

#: Arrays this large (bytes) or larger are mapped without huge pages.
NO_HUGEPAGE_BYTES = 1 << 29


def filled(shape: tuple[int, ...], value: int, dtype=np.int64) -> np.ndarray:
    """``np.full(shape, value, dtype)``, mapped without huge pages when it is large.

    Parameters
    ----------
    shape : tuple of int
    value : int
        The fill value.
    dtype : numpy dtype, optional

    Returns
    -------
    ndarray
        C-contiguous and writable (backed by an anonymous ``mmap`` when large).
    """
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if nbytes < NO_HUGEPAGE_BYTES or not hasattr(mmap, "MADV_NOHUGEPAGE"):
        return np.full(shape, value, dtype=dtype)
    buffer = mmap.mmap(-1, nbytes)
    buffer.madvise(mmap.MADV_NOHUGEPAGE)
    array = np.frombuffer(buffer, dtype=dtype).reshape(shape)
    array.fill(value)
    return array
