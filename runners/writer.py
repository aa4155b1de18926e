"""Result files of one run (SPEC §10), written atomically.

Every file is first written to a hidden temporary name in the output
directory and renamed (``os.replace``) only once all of them are complete, so
a failed run leaves no partial result file; ``summary.json`` is renamed last
and marks a finished run.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

import simcore
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


def _parquet_writer(table: pa.Table) -> Callable[[Path], None]:
    return lambda path: pq.write_table(table, path, compression=PARQUET_COMPRESSION)


def _json_writer(document: dict) -> Callable[[Path], None]:
    text = json.dumps(document, indent=2, allow_nan=False) + "\n"
    return lambda path: path.write_text(text, encoding="utf-8")


def write_results(result: simcore.Result, out_dir: str | os.PathLike) -> list[Path]:
    """Write the result files of ``result`` into ``out_dir``.

    Parameters
    ----------
    result : simcore.Result
        A finished run.
    out_dir : str or path-like
        Output directory; created if missing.

    Returns
    -------
    list of Path
        The files written: ``requests.parquet``, then ``passes.parquet`` and
        ``tokens.parquet`` when recorded, then ``summary.json``.

    Notes
    -----
    Files are staged under hidden temporary names in ``out_dir`` and renamed
    only when all of them are written; on any failure the temporary files are
    removed and the exception propagates.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tables = {"requests": result.requests, "passes": result.passes, "tokens": result.tokens}
    writers = [
        (f"{name}.parquet", _parquet_writer(table)) for name, table in tables.items() if table is not None
    ]
    writers.append(("summary.json", _json_writer(summary_document(result))))
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
    written = [final for _, final in staged]
    # A rerun into the same directory must not leave an earlier run's optional
    # tables beside the new summary.
    for name in ("passes.parquet", "tokens.parquet"):
        if out / name not in written:
            (out / name).unlink(missing_ok=True)
    return written
