"""Leave-one-run-out calibration over the measured runs: fit on the others, score the one left out.

    python bench/calibration_transfer.py [--data DIR] [--out docs/accuracy.md] [--max-evals 2400] [--seed 0]
        [--losses quantiles,bench,requests,summary]

Each measured run of ``shared/data/llmservingsim-vllm-bench`` (LLMServingSim's vLLM 0.19.0
runs, MIT licence, CASYS Lab at KAIST; its README) is replayed as shipped
(``bench/accuracy.py``'s ``case_setup``: the run's own engine limits, KV capacity,
asynchronous scheduling, prefix caching, CUDA-graph sizes, prompts' shared blocks, profile
timing).  For each run, ``replaysim-calibrate``'s ``calibrate_runs`` fits the operator scales
(``timing.prefill_token_scale``, ``timing.decode_attention_scale``,
``timing.decode_base_scale``; docs/timing.md) on every other run at once, each replayed
whole with its own deployment, and scores the run left out with the values found; one more
fit on all the runs gives the centre of the stability figures, the spread of each parameter
over the leave-one-run-out fits.  The MoE run with expert parallelism takes part like the
others (the scales split each rank's time within the ranks' lock-step pass; docs/timing.md).
Then each run alone: the same scales fitted on its first half (by send instant) and scored on
its second, with each loss of ``--losses`` (the first is the one the leave-one-run-out fits use;
default: ``replaysim-calibrate``'s own), the same for every run.  Runs whose deployment refuses
the operator scales are named and left out.  The section "Calibration across runs" of ``--out``
is replaced (or added before "Roofline timing"); the rest of the file is kept.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import accuracy  # noqa: E402
from runners import calibrate as cal  # noqa: E402
from simcore.config import ConfigError, load_config  # noqa: E402

HEADING = accuracy.TRANSFER_HEADING
FITTED = ["timing.prefill_token_scale", "timing.decode_attention_scale", "timing.decode_base_scale"]
METRICS = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2el_ms", "E2E"))


def runs(root: str) -> tuple[list[cal.FitRun], list[str]]:
    """Every measured run as shipped, and the notes of those left out."""
    found, skipped = [], []
    bench = os.path.join(root, "bench")
    for gpu in sorted(os.listdir(bench)):
        for model_dir in sorted(os.listdir(os.path.join(bench, gpu))):
            try:
                setup = accuracy.case_setup(root, gpu, model_dir)
            except KeyError as exc:  # a run whose model accuracy.MODELS does not describe
                skipped.append(f"{gpu}/{model_dir}: no accuracy.MODELS entry {exc}")
                continue
            shipped = setup["shipped"]
            label = f"{gpu} {setup['name'].split('/')[-1]} TP{setup['tp']}" + (
                f" DP{setup['dp']} EP{setup['ep']}" if setup["expert_parallel"] else "")
            trial = dict(shipped, timing=dict(shipped["timing"], prefill_token_scale=1.01))
            try:
                load_config(trial)
            except ConfigError as exc:
                skipped.append(f"{label}: {exc}")
                continue
            overrides = {key: value for key, value in shipped.items() if key in ("engine", "timing")}
            if "source" in shipped.get("workload", {}):  # the prompts' trace
                overrides["workload"] = {k: v for k, v in shipped["workload"].items() if k != "num_requests"}
            path = os.path.join(setup["case"], "vllm", "requests.jsonl")
            found.append(cal.FitRun(label, overrides, measured=cal.read_measured(path)))
    return found, skipped


def mean_errors(report: dict, part: str = "fit") -> dict[str, dict[str, float]]:
    """{calibrated, uncalibrated: {metric: error of the mean}} over ``part`` (fit: the whole run
    when it is all fitted)."""
    part = report["parts"][part]
    return {side: {col: part[side][f"mean_{col}"]["error"] for col, _ in METRICS}
            for side in ("calibrated", "uncalibrated")}


def transfer(found: list[cal.FitRun], max_evals: int, seed: int, losses: list[str]) -> dict:
    fit = cal.parse_fit(FITTED)
    start = time.perf_counter()
    everything = cal.calibrate_runs(found, fit, fit_fraction=1.0, max_evals=max_evals, seed=seed, loss=losses[0])
    left_out = []
    for i, run in enumerate(found):
        others = found[:i] + found[i + 1:]
        result = cal.calibrate_runs(others, fit, fit_fraction=1.0, max_evals=max_evals, seed=seed, score=[run],
                                    loss=losses[0])
        left_out.append({"run": run.label, "values": result.values, "errors": mean_errors(result.scored[0]),
                         "extrapolation": result.scored[0]["extrapolation"], "warnings": result.warnings,
                         "in_flight": result.scored[0]["in_flight"]})
    spread = {}
    for key in FITTED:
        series = [row["values"][key] for row in left_out]
        centre = everything.values[key]
        spread[key] = {"value": centre, "min": min(series), "max": max(series),
                       "spread": (max(series) - min(series)) / abs(centre)}
    halves = []
    for run in found:
        for loss in losses:
            result = cal.calibrate_runs([run], fit, fit_fraction=0.5, max_evals=max_evals, seed=seed, loss=loss)
            halves.append({"run": run.label, "loss": loss, "values": result.values,
                           "fit": mean_errors(result.runs[0], "fit"),
                           "held_out": mean_errors(result.runs[0], "held_out")})
    return {"all": everything, "left_out": left_out, "stability": spread, "halves": halves,
            "seconds": time.perf_counter() - start}


def pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def section(result: dict, found: list[cal.FitRun], skipped: list[str], max_evals: int, seed: int,
            losses: list[str]) -> list[str]:
    lines = [
        HEADING,
        "",
        "Generated by `python bench/calibration_transfer.py` (this section only; the rest of the file by "
        "`bench/accuracy.py`). Data: `shared/data/llmservingsim-vllm-bench` (LLMServingSim's measured vLLM "
        "0.19.0 runs; MIT licence, Copyright (c) 2024 CASYS Lab at KAIST, as its README states). Each run is "
        "replayed as shipped (the columns above); `replaysim-calibrate` fits the operator scales "
        f"({', '.join(f'`{k}`' for k in FITTED)}; docs/timing.md) on every other run at once (each whole, with "
        f"its own deployment; loss `{losses[0]}`, summed over the runs), then the run left out is replayed with "
        f"the values found and scored on its own measurement. Optimiser budget {max_evals} replays a fit, seed {seed}. "
        "The runs differ in GPU and model, so this asks whether one set of operator scales (the profiles' shared "
        "bias: eager-mode per-layer kernels against the served engine's) carries from runs to another run.",
        "",
        "| run left out | mean TTFT as shipped | mean TTFT calibrated | mean TPOT as shipped | mean TPOT calibrated "
        "| mean E2E as shipped | mean E2E calibrated | fitted on the others |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in result["left_out"]:
        e = row["errors"]
        values = ", ".join(f"{k.split('.')[-1]} {v:.3g}" for k, v in row["values"].items())
        lines.append(f"| {row['run']} | {pct(e['uncalibrated']['ttft_ms'])} | {pct(e['calibrated']['ttft_ms'])} "
                     f"| {pct(e['uncalibrated']['tpot_ms'])} | {pct(e['calibrated']['tpot_ms'])} "
                     f"| {pct(e['uncalibrated']['e2el_ms'])} | {pct(e['calibrated']['e2el_ms'])} | {values} |")
    n = len(result["left_out"])
    mae = {side: {col: sum(abs(r["errors"][side][col]) for r in result["left_out"]) / n for col, _ in METRICS}
           for side in ("uncalibrated", "calibrated")}
    lines.append(f"| mean absolute error ({n} runs) | {100 * mae['uncalibrated']['ttft_ms']:.1f}% "
                 f"| {100 * mae['calibrated']['ttft_ms']:.1f}% | {100 * mae['uncalibrated']['tpot_ms']:.1f}% "
                 f"| {100 * mae['calibrated']['tpot_ms']:.1f}% | {100 * mae['uncalibrated']['e2el_ms']:.1f}% "
                 f"| {100 * mae['calibrated']['e2el_ms']:.1f}% | |")
    better = {col: mae["calibrated"][col] < mae["uncalibrated"][col] for col, _ in METRICS}
    verdict = ("lower" if all(better.values()) else "raise" if not any(better.values()) else "move")
    lines += [
        "",
        f"Fitted on the other runs, the operator scales {verdict} the mean absolute error of the left-out runs' "
        "means against the as-shipped replay (" + ", ".join(
            f"{label} {100 * mae['uncalibrated'][col]:.1f}% -> {100 * mae['calibrated'][col]:.1f}%"
            for col, label in METRICS) + "). Where they raise it, what a run's fit absorbs is that run's own "
        "(its GPU, its model, its profile), not a bias the runs share: the as-shipped replay, whose every "
        "parameter comes from the run's own files, is the better prediction for a run not measured, and the "
        "spreads below say how far a fit on other runs moves.",
    ]
    lines += [
        "",
        "Stability: each parameter fitted on all the runs, and its range over the leave-one-run-out fits "
        "(spread = (max - min) / the all-runs value):",
        "",
        "| parameter | all runs | min | max | spread |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for key, p in result["stability"].items():
        lines.append(f"| `{key}` | {p['value']:.4g} | {p['min']:.4g} | {p['max']:.4g} | {100 * p['spread']:.1f}% |")
    everything = result["all"]
    lines += ["", "All runs fitted together, each run's mean errors with those values (in the fit):", ""]
    for report in everything.runs:
        e = mean_errors(report)
        lines.append(f"- {report['label']}: mean TTFT {pct(e['calibrated']['ttft_ms'])}, TPOT "
                     f"{pct(e['calibrated']['tpot_ms'])}, E2E {pct(e['calibrated']['e2el_ms'])} (as shipped "
                     f"{pct(e['uncalibrated']['ttft_ms'])}, {pct(e['uncalibrated']['tpot_ms'])}, "
                     f"{pct(e['uncalibrated']['e2el_ms'])}); mean requests in flight {report['in_flight']:.3g}")
    lines += [
        "",
        "Each run alone, held out: the same three scales fitted on the run's first half by send instant and "
        "scored on its second half (its own measured values), with each loss below, the same for every run "
        f"(`{losses[0]}` is `replaysim-calibrate`'s default and the loss of the fits above); the as-shipped "
        "replay's errors on the same half beside them:",
        "",
        "| run | loss | held out mean TTFT as shipped | calibrated | held out mean TPOT as shipped | calibrated "
        "| held out mean E2E as shipped | calibrated | fit half mean TTFT calibrated | fitted |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in result["halves"]:
        e, f = row["held_out"], row["fit"]
        values = ", ".join(f"{k.split('.')[-1]} {v:.3g}" for k, v in row["values"].items())
        lines.append(f"| {row['run']} | `{row['loss']}` | {pct(e['uncalibrated']['ttft_ms'])} "
                     f"| {pct(e['calibrated']['ttft_ms'])} | {pct(e['uncalibrated']['tpot_ms'])} "
                     f"| {pct(e['calibrated']['tpot_ms'])} | {pct(e['uncalibrated']['e2el_ms'])} "
                     f"| {pct(e['calibrated']['e2el_ms'])} | {pct(f['calibrated']['ttft_ms'])} | {values} |")
    warned = [w for row in result["left_out"] for w in row["warnings"]]
    if warned:
        lines += ["", "Extrapolation warnings (the left-out run's load outside the fitted runs' by more than "
                  f"{cal.DEFAULT_MAX_EXTRAPOLATION:g}x):", ""] + [f"- {w}" for w in warned]
    if skipped:
        lines += ["", "Left out of this section:", ""] + [f"- {note}" for note in skipped]
    fits = n + 1 + len(result["halves"])
    lines += ["", f"{fits} fits in {result['seconds']:.0f} s at a load average of {os.getloadavg()[0]:.1f}.", ""]
    return lines


def splice(path: str, lines: list[str]) -> str:
    """``path``'s text with the section replaced, or added before the roofline section."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    body = "\n".join(lines)
    if HEADING in text:
        head, rest = text.split(HEADING, 1)
        tail = rest.split("\n## ", 1)
        return head + body + ("\n## " + tail[1] if len(tail) > 1 else "")
    marker = accuracy.ROOFLINE_HEADING
    head, rest = text.split(marker, 1) if marker in text else (text, None)
    return head + body + "\n" + (marker + rest if rest is not None else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=os.path.normpath(accuracy.DEFAULT_DATA))
    parser.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "docs", "accuracy.md"))
    parser.add_argument("--max-evals", type=int, default=2400, help="replays per fit (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--losses", default=cal.DEFAULT_LOSS,
                        help="comma-separated losses of the per-run halves, the first also that of the "
                             "leave-one-run-out fits (default %(default)s)")
    args = parser.parse_args(argv)
    losses = args.losses.split(",")
    unknown = [loss for loss in losses if loss not in cal.LOSSES]
    if unknown:
        parser.error(f"--losses: {unknown[0]!r} is not one of {', '.join(cal.LOSSES)}")
    found, skipped = runs(args.data)
    if len(found) < 2:
        parser.error(f"need two or more runs to leave one out, found {len(found)}")
    result = transfer(found, args.max_evals, args.seed, losses)
    lines = section(result, found, skipped, args.max_evals, args.seed, losses)
    text = splice(args.out, lines)
    with open(args.out, "w", encoding="utf-8") as handle:
        handle.write(text)
    print("\n".join(lines))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
