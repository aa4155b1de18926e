"""Result files of one run (SPEC §10), written atomically.

Every file is first written to a hidden temporary name in the output
directory and renamed (``os.replace``) only once all of them are complete, so
a failed run leaves no partial result file; ``summary.json`` is renamed last
and marks a finished run.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

import simcore
from runners.export import EXPORT_FILES
from simcore.schema import SCHEMA_VERSION

PARQUET_COMPRESSION = "zstd"


@lru_cache(maxsize=1)
def git_sha() -> str | None:
    """The commit of the source checkout holding :mod:`simcore`, or None.

    Returns
    -------
    str or None
        ``git rev-parse HEAD`` of the checkout (editable installs only); None
        for an installed wheel, without git, or when git fails.
    """
    root = Path(simcore.__file__).resolve().parent.parent
    if not (root / ".git").exists():  # not a checkout: never report an enclosing repo
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=5, check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def summary_document(result: simcore.Result) -> dict[str, Any]:
    """The content of ``summary.json``.

    Parameters
    ----------
    result : simcore.Result
        A finished run.

    Returns
    -------
    dict
        The summary metrics (``vllm bench serve`` key names), then ``config``
        (the resolved configuration), ``version``, ``seed``, ``git_sha`` and
        ``schema_version``.
    """
    return {
        **result.summary,
        "config": result.config.resolved,
        "version": simcore.__version__,
        "seed": result.config.seed,
        "git_sha": git_sha(),
        "schema_version": SCHEMA_VERSION,
    }


def _json_bytes(document: dict, compact: bool) -> bytes:
    options = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE
    return orjson.dumps(document, option=options if compact else options | orjson.OPT_INDENT_2)


def json_text(document: dict, compact: bool = False) -> str:
    """``document`` as JSON text, serialized with orjson.

    orjson is fast on the long per-request arrays of a detailed
    ``vllm_bench.json``.  Indented by 2 unless ``compact``; NumPy scalars and
    arrays are accepted; a non-finite float is written as null, never as the
    non-JSON ``NaN``.
    """
    return _json_bytes(document, compact).decode()


def json_file(document: dict, compact: bool = False) -> Callable[[Path], None]:
    """A writer for :func:`write_atomic` that stores ``document`` as JSON (:func:`json_text`)."""
    data = _json_bytes(document, compact)
    return lambda path: path.write_bytes(data)


def text_file(text: str) -> Callable[[Path], None]:
    """A writer for :func:`write_atomic` that stores ``text`` as UTF-8."""
    return lambda path: path.write_text(text, encoding="utf-8", newline="")


def parquet_file(table: pa.Table) -> Callable[[Path], None]:
    """A writer for :func:`write_atomic` that stores ``table`` as zstd Parquet."""
    return lambda path: pq.write_table(table, path, compression=PARQUET_COMPRESSION)


def write_atomic(out_dir: str | os.PathLike, writers: list[tuple[str, Callable[[Path], None]]]) -> list[Path]:
    """Write several files into ``out_dir`` all-or-nothing.

    Parameters
    ----------
    out_dir : str or path-like
        Output directory; created if missing.
    writers : list of (name, callable)
        File name and a function that writes the file's content to the path it
        is given (a hidden temporary name in ``out_dir``).

    Returns
    -------
    list of Path
        The final paths, in the order of ``writers``.

    Notes
    -----
    Every file is staged under a hidden temporary name; only when all are
    written are they renamed (``os.replace``) in order, so the last one named
    marks completion.  On any failure the temporary files are removed and the
    exception propagates.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    staged: list[tuple[Path, Path]] = []
    try:
        for name, write in writers:
            tmp = out / f".{name}.{uuid.uuid4().hex[:12]}.tmp"
            staged.append((tmp, out / name))
            write(tmp)
        for tmp, final in staged:
            os.replace(tmp, final)
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    return [final for _, final in staged]


def with_columns(table: pa.Table, columns: pa.Table | None) -> pa.Table:
    """Prepend constant columns (``run_id``, ``seed``, swept parameters) to ``table``.

    Parameters
    ----------
    table : pyarrow.Table
        A result table (requests, passes or tokens).
    columns : pyarrow.Table or None
        A one-row table whose columns are repeated on every row of ``table``
        (same types, same field metadata); None returns ``table`` unchanged.

    Returns
    -------
    pyarrow.Table
        ``columns`` then the columns of ``table``; the schema metadata of
        ``table`` (``schema_version``) is kept.
    """
    if columns is None:
        return table
    clash = set(columns.column_names) & set(table.column_names)
    if clash:
        raise ValueError(f"sweep columns {sorted(clash)} clash with result columns")
    n = table.num_rows
    index = pa.array(np.zeros(n, dtype=np.int64))
    arrays = [columns.column(i).take(index) for i in range(columns.num_columns)]
    fields = list(columns.schema) + list(table.schema)
    schema = pa.schema(fields, metadata=table.schema.metadata)
    return pa.Table.from_arrays([*arrays, *table.columns], schema=schema)


def write_results(
    result: simcore.Result,
    out_dir: str | os.PathLike,
    columns: pa.Table | None = None,
    extra: dict[str, dict | str] | None = None,
) -> list[Path]:
    """Write the result files of ``result`` into ``out_dir``.

    Parameters
    ----------
    result : simcore.Result
        A finished run.
    out_dir : str or path-like
        Output directory; created if missing.
    columns : pyarrow.Table, optional
        One row of constant columns (sweep runs: ``run_id``, ``seed`` and the
        swept parameters) prepended to every Parquet table; see
        :func:`with_columns`.
    extra : dict of str to (dict or str), optional
        Further files by name, written in the same all-or-nothing step before
        ``summary.json``: a dict as compact JSON (``vllm_bench.json`` can hold
        per-request arrays), a str as text (a CSV export).

    Returns
    -------
    list of Path
        The files written: ``requests.parquet``, then ``passes.parquet`` and
        ``tokens.parquet`` when recorded, then the ``extra`` files, then
        ``summary.json``.

    Notes
    -----
    Files are staged under hidden temporary names in ``out_dir`` and renamed
    only when all of them are written; on any failure the temporary files are
    removed and the exception propagates.  ``summary.json`` is renamed last and
    marks a finished run.
    """
    out = Path(out_dir)
    tables = {"requests": result.requests, "passes": result.passes, "tokens": result.tokens}
    writers = [
        (f"{name}.parquet", parquet_file(with_columns(table, columns)))
        for name, table in tables.items()
        if table is not None
    ]
    writers += [
        (name, text_file(content) if isinstance(content, str) else json_file(content, compact=True))
        for name, content in (extra or {}).items()
    ]
    writers.append(("summary.json", json_file(summary_document(result))))
    written = write_atomic(out, writers)
    # A rerun into the same directory must not leave an earlier run's optional
    # tables or exports beside the new summary.
    for name in ("passes.parquet", "tokens.parquet", *EXPORT_FILES):
        if out / name not in written:
            (out / name).unlink(missing_ok=True)
    return written
