"""Result files of one run (SPEC §10), committed as one set.

Every file is first written to a hidden temporary name in the output
directory and renamed (``os.replace``) only once all of them are complete, so
a failed run leaves no partial result file; ``summary.json`` is renamed after
the tables, then ``manifest.json`` (names, sizes and SHA-256 of the set) last.

Writers of one directory are serialised by an exclusive ``flock`` on the
directory itself, held from the first staged file to the manifest; readers
(:func:`verified_set`, resume) take it shared, so they see the previous
complete set or the new one, never a mix.  A lock rather than a staging
directory renamed into place: the result files live directly in
``output.dir`` beside files replaysim did not write, and a directory holding
other files cannot be replaced atomically.  The kernel drops the lock of a
killed process, and the hidden temporary files such a process leaves are
removed by the next writer, under the lock.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import subprocess
import uuid
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

import simcore
from simcore.arrow_np import to_arrow
from simcore.schema import SCHEMA_VERSION

PARQUET_COMPRESSION = "zstd"
MANIFEST_FILE = "manifest.json"
#: The hidden name a file is staged under (:func:`write_atomic`).
_TEMP_NAME = re.compile(r"^\..+\.[0-9a-f]{12}\.tmp$")


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


@contextmanager
def locked(out_dir: str | os.PathLike, exclusive: bool = True) -> Iterator[Path]:
    """Hold ``flock`` on the directory ``out_dir`` (created if missing) for the ``with`` body.

    Parameters
    ----------
    out_dir : str or path-like
        The directory.
    exclusive : bool
        An exclusive (writer) lock, else a shared (reader) one.

    Yields
    ------
    Path
        ``out_dir``.

    Raises
    ------
    OSError
        The directory cannot be created or opened (a file in the way, no
        permission, a full disk).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield out
    finally:
        os.close(fd)  # releases the lock


def remove_stale_temps(out: Path) -> list[Path]:
    """Remove the hidden temporary files a killed writer left in ``out``; call under :func:`locked`.

    Only names of the form ``.<name>.<12 hex digits>.tmp`` are removed.
    """
    removed = []
    for path in out.iterdir():
        if _TEMP_NAME.match(path.name) and path.is_file():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def check_writable(out_dir: str | os.PathLike) -> None:
    """Raise the OSError a write into ``out_dir`` would meet, before anything is simulated.

    Creates the directory and a hidden probe file in it (removed at once,
    named as a temporary file so that a killed probe is cleaned up too): a
    file in the way, no permission or a read-only file system raise
    ``OSError`` naming the path, whoever runs it (root included).
    """
    with locked(out_dir) as out:
        probe = out / f".probe.{uuid.uuid4().hex[:12]}.tmp"
        try:
            probe.touch(exist_ok=False)
        except OSError as exc:  # named after the directory, not the probe
            raise OSError(exc.errno, exc.strerror, str(out)) from None
        probe.unlink()


def file_digest(path: Path) -> str:
    """SHA-256 of the file at ``path``, hex."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def read_manifest(out: Path) -> dict[str, dict] | None:
    """``manifest.json`` of ``out``: file name -> ``{"size", "sha256"}``, or None when absent or unreadable."""
    try:
        document = orjson.loads((out / MANIFEST_FILE).read_bytes())
        files = document["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
        return None
    if any(Path(name).name != name or name in ("", ".", "..") for name in files):
        return None  # only plain names in this directory: nothing elsewhere is ever removed
    return files


def _set_matches(out: Path, files: dict[str, dict]) -> bool:
    for name, entry in files.items():
        path = out / name
        try:
            if path.stat().st_size != entry.get("size") or file_digest(path) != entry.get("sha256"):
                return False
        except OSError:
            return False
    return True


def verified_set(out_dir: str | os.PathLike) -> list[str] | None:
    """The names of the complete result set in ``out_dir``, or None.

    The set is the one ``manifest.json`` lists; it is complete when every
    listed file exists with the listed size and SHA-256.  Read under a shared
    lock, so a writer committing a new set is waited for.
    """
    out = Path(out_dir)
    if not (out / MANIFEST_FILE).is_file():
        return None
    with locked(out, exclusive=False):
        files = read_manifest(out)
        if files is None or not _set_matches(out, files):
            return None
    return list(files)


def write_atomic(
    out_dir: str | os.PathLike,
    writers: list[tuple[str, Callable[[Path], None]]],
    *,
    manifest: bool = False,
) -> list[Path]:
    """Write several files into ``out_dir`` all-or-nothing.

    Parameters
    ----------
    out_dir : str or path-like
        Output directory; created if missing.
    writers : list of (name, callable)
        File name and a function that writes the file's content to the path it
        is given (a hidden temporary name in ``out_dir``).
    manifest : bool
        The files form a result set: write ``manifest.json`` (their names,
        sizes and SHA-256) after them, and remove the files the previous
        manifest listed that this set does not have.

    Returns
    -------
    list of Path
        The final paths, in the order of ``writers`` (without the manifest).

    Notes
    -----
    The directory is locked (:func:`locked`) throughout and the temporary
    files of killed writers are removed first.  Every file is staged under a
    hidden temporary name; only when all are written are they renamed
    (``os.replace``) in order, so the last one named marks completion.  On any
    failure (a signal included) the temporary files are removed and the
    exception propagates.
    """
    staged: list[tuple[Path, Path]] = []
    with locked(out_dir) as out:
        remove_stale_temps(out)
        try:
            for name, write in writers:
                tmp = out / f".{name}.{uuid.uuid4().hex[:12]}.tmp"
                staged.append((tmp, out / name))
                write(tmp)
            if manifest:
                files = {final.name: {"size": tmp.stat().st_size, "sha256": file_digest(tmp)} for tmp, final in staged}
                previous = read_manifest(out) or {}
                tmp = out / f".{MANIFEST_FILE}.{uuid.uuid4().hex[:12]}.tmp"
                staged.append((tmp, out / MANIFEST_FILE))
                tmp.write_bytes(orjson.dumps({"files": files}, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE))
            for tmp, final in staged:
                os.replace(tmp, final)
        except BaseException:
            for tmp, _ in staged:
                tmp.unlink(missing_ok=True)
            raise
        if manifest:
            for name in set(previous) - set(files) - {MANIFEST_FILE}:
                (out / name).unlink(missing_ok=True)
    return [final for _, final in staged if not (manifest and final.name == MANIFEST_FILE)]


def remove_result_set(out_dir: str | os.PathLike) -> None:
    """Remove the files of the result set ``manifest.json`` lists, then the manifest (under the lock)."""
    out = Path(out_dir)
    if not (out / MANIFEST_FILE).exists():
        return
    with locked(out) as out:
        for name in read_manifest(out) or {}:
            if name != MANIFEST_FILE:
                (out / name).unlink(missing_ok=True)
        (out / MANIFEST_FILE).unlink(missing_ok=True)


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
    index = to_arrow(np.zeros(n, dtype=np.int64))
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
        The files written: ``requests.parquet``, then ``passes.parquet``,
        ``tokens.parquet`` and ``scaling.parquet`` (autoscaling) when recorded, then the ``extra`` files, then
        ``summary.json``.

    Notes
    -----
    Files are staged under hidden temporary names in ``out_dir`` and renamed
    only when all of them are written; on any failure the temporary files are
    removed and the exception propagates.  ``summary.json`` is renamed after
    the tables, then ``manifest.json``, which marks a finished run
    (:func:`write_atomic` with ``manifest=True``); the files of the previous
    set that this one lacks are removed, no other file.
    """
    out = Path(out_dir)
    # a pass table recorded for the trace alone (runners.sweep) is not written
    passes = result.passes if result.config.output.passes else None
    tables = {"requests": result.requests, "passes": passes, "tokens": result.tokens, "scaling": result.scaling}
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
    return write_atomic(out, writers, manifest=True)
