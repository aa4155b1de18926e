"""The Azure reader's vectorised line numbering equals splitting the file at newlines."""

import random

from simcore.workload.traces import _csv_row_lines, _line_spans


def test_line_spans_and_row_lines_equal_the_split_lines():
    rng = random.Random(7)
    cases = [b"", b"\n", b"\r\n", b"\r\r\n\n", b"a", b"a\r", b"x\r\n\r\ny\n"]
    cases += [bytes(rng.choice(b"a\r\n,1") for _ in range(rng.randint(0, 14))) for _ in range(2000)]
    for data in cases:
        lines = data.split(b"\n")
        starts, stops = _line_spans(data)
        assert [data[a:b] for a, b in zip(starts, stops)] == lines
        expected = [number for number, text in enumerate(lines, 1) if text.rstrip(b"\r")]
        assert _csv_row_lines(data, starts, stops) == expected, data
