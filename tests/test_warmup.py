"""``replaysim-warmup``: its cases run, and bad arguments get one line and exit 2."""

from __future__ import annotations

import pytest

from runners import warmup
from simcore.config import load_config


def test_every_case_is_a_valid_configuration():
    for case, extras in warmup.CASES.items():
        for extra in extras:
            load_config(warmup._merged(warmup._TINY, extra))  # raises on a key the config refuses


def test_default_then_the_others_in_workers(capsys):
    assert warmup.main(["--cases", "pd,default", "--jobs", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "replaysim-warmup: default, then 1 more case(s) on 1 process(es)"
    assert lines[1].startswith("replaysim-warmup: default in ") and lines[2].startswith("replaysim-warmup: pd in ")
    assert lines[3].startswith("replaysim-warmup: done in ")


@pytest.mark.parametrize("argv, message", [
    (["--cases", "default,nope"], "replaysim-warmup: error: --cases: unknown case 'nope'"),
    (["--cases", ","], "replaysim-warmup: error: --cases: no case given"),
    (["--jobs", "0"], "replaysim-warmup: error: --jobs must be in [1, 64], got 0"),
])
def test_bad_arguments_get_one_line_and_exit_2(argv, message, capsys):
    assert warmup.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [message] and captured.out == ""


@pytest.mark.parametrize("argv, message", [
    (["--bogus"], "replaysim-warmup: error: unrecognized arguments: --bogus"),
    (["--jobs", "x"], "replaysim-warmup: error: argument --jobs: invalid int value: 'x'"),
])
def test_argparse_errors_are_one_line(capsys, argv, message):
    assert warmup.main(argv) == 2
    assert capsys.readouterr().err == message + "\n"
