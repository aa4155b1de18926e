"""The documented result columns are the declared Arrow schemas."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from simcore.schema import PASSES_SCHEMA, REQUESTS_SCHEMA, TOKENS_SCHEMA

DOC = Path(__file__).resolve().parents[1] / "docs" / "results.md"


def documented(section: str) -> list[tuple[str, str]]:
    text = DOC.read_text().split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([a-z0-9_]+)` \| [^|]+ \| ([^|]+) \|", text, flags=re.M)


@pytest.mark.parametrize(
    "section, schema",
    [("requests.parquet", REQUESTS_SCHEMA), ("passes.parquet", PASSES_SCHEMA), ("tokens.parquet", TOKENS_SCHEMA)],
)
def test_results_doc_lists_the_schema(section, schema):
    expected = [(f.name, f.metadata[b"unit"].decode() or "-") for f in schema]
    assert [(name, unit.strip()) for name, unit in documented(section)] == expected
