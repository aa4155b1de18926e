"""Progress: one start and one end line off a terminal, tqdm phases on one."""

from __future__ import annotations

import io
import subprocess
import sys

import simcore
from runners import progress as progress_module
from runners.progress import LineProgress, RunProgress
from simcore.jit_cache import engine_kernel_cached


def test_a_run_off_a_terminal_prints_a_start_and_an_end_line_and_no_bar():
    bar, lines = io.StringIO(), io.StringIO()
    with RunProgress(cold=True, enabled=False, bar_stream=bar, line_stream=lines) as run:
        for done in (0, 0, 4, 10):
            run.update(done, 10)
        run.writing()
    out = lines.getvalue().splitlines()
    assert bar.getvalue() == ""
    assert out[0] == "replaysim: simulating; compiling kernels (first run only)"
    assert len(out) == 2 and out[1].startswith("replaysim: 10 requests simulated in ")
    assert "kernels compiled in" in out[1] and "results written in" in out[1]


def test_a_failed_run_prints_no_end_line():
    lines = io.StringIO()
    run = RunProgress(cold=False, enabled=False, bar_stream=io.StringIO(), line_stream=lines)
    run.close(ok=False)
    run.close()
    assert lines.getvalue().splitlines() == ["replaysim: simulating"]


def test_on_a_terminal_the_bar_shows_each_phase_and_is_cleared():
    bar, lines = io.StringIO(), io.StringIO()
    run = RunProgress(cold=True, enabled=True, bar_stream=bar, line_stream=lines)
    run.update(0, 10)
    run.update(5, 10)
    run.update(10, 10)
    run.writing()
    run.close()
    drawn = bar.getvalue()
    phases = ["compiling kernels (first run only)", "simulating", "computing metrics", "writing results"]
    positions = [drawn.find(phase) for phase in phases]
    assert -1 not in positions and positions == sorted(positions), drawn
    assert "10/10" in drawn and drawn.endswith("\r")  # counts unscaled below 10k; cleared at the end
    assert lines.getvalue().count("\n") == 1  # the end line only: the bar replaced the start line


def test_on_a_terminal_a_warm_run_shows_the_bar_with_its_total():
    bar = io.StringIO()
    run = RunProgress(cold=False, enabled=True, bar_stream=bar, line_stream=io.StringIO())
    run.update(0, 20)
    run.update(20, 20)
    run.writing()
    run.close()
    assert "compiling" not in bar.getvalue() and "100% 20/20" in bar.getvalue()


def test_the_cli_off_a_terminal_prints_two_progress_lines_and_keeps_stderr_clean(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "runners.cli", f"output.dir={tmp_path}", f"hydra.run.dir={tmp_path / 'h'}",
         "workload.num_requests=8", "workload.input_tokens=32", "workload.output_tokens=3"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    out = done.stdout.splitlines()
    assert out[0].startswith("replaysim: simulating") and out[1].startswith("replaysim: 8 requests simulated in ")
    assert "replaysim result" in out[2]


def test_the_engine_kernel_is_found_in_the_cache_after_a_run():
    simcore.run({"workload": {"num_requests": 2, "input_tokens": 8, "output_tokens": 2}})
    assert engine_kernel_cached()


def test_sweep_lines_off_a_terminal_are_a_start_and_an_end_line():
    stream = io.StringIO()
    points = LineProgress(4, "sweep", stream=stream, enabled=False)
    for _ in range(4):
        points.update()
    points.close()
    out = stream.getvalue().splitlines()
    assert out[0] == "sweep: 4 points" and out[1].startswith("sweep: 4/4 points done in ") and len(out) == 2


def test_sweep_status_lines_on_a_terminal_are_whole_lines_with_an_eta(monkeypatch):
    monkeypatch.setattr(progress_module, "STATUS_EVERY_S", 0.0)
    stream = io.StringIO()
    points = LineProgress(4, "sweep", stream=stream, enabled=True)
    points.update(2)
    points.update(2)  # no new point: no new line
    points.close()
    out = stream.getvalue().splitlines()
    assert len(out) == 3
    assert out[1].startswith("sweep:  50%|") and "2/4" in out[1] and "<" in out[1]  # elapsed<remaining


def test_every_bar_line_fits_a_40_column_terminal_and_keeps_its_figures_first():
    from tqdm import tqdm

    for prefix in ("simulating", "computing metrics", "writing results"):
        line = tqdm.format_meter(123_456, 400_000, 3.2, ncols=40, prefix=prefix, unit_scale=True,
                                 bar_format=progress_module.RUNNING_FORMAT)
        assert len(line) <= 40 and line.startswith(" 31% 123k/400k [00:03<00:07]"), line
    waiting = tqdm.format_meter(0, None, 75.0, ncols=40, prefix="compiling kernels (first run only)",
                                bar_format=progress_module.WAITING_FORMAT)
    assert len(waiting) <= 40 and waiting.startswith("01:15 compiling kernels")
