"""Issue 13's determinism checks: one config and seed give bit-identical tables.

Through the ``replaysim`` command (subprocesses, each from its own directory):
the same run twice; a two-point sweep with the basic launcher and with the
joblib launcher (``hydra/launcher=local``; the sweep directories have the same
name, so ``run_id`` agrees); and a run with a cold numba cache (a fresh
``NUMBA_CACHE_DIR`` for that subprocess only: every kernel compiled) against
one with the warm cache.  Each compares the bytes of ``requests.parquet`` (and
of ``passes.parquet`` and ``tokens.parquet``) and ``summary.json`` without its
config's ``output.dir``.  Prints ``check,config,files,identical`` rows and a count.
``python bench/determinism.py`` (``--no-cold``: skip the cold-cache run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Configurations that reach the main paths: closed loop with detokenization,
#: Poisson with tokenization, P/D with KV transfers, the sglang policy.
CONFIGS = {
    "closed-detok": ["workload.num_requests=400", "workload.input_dist=uniform", "workload.range_ratio=0.5",
                     "load.concurrency=32", "detokenization.workers=2", "detokenization.base_ms=2.85",
                     "detokenization.per_output_us=61.6"],
    "poisson-tok": ["workload.num_requests=400", "load.type=poisson", "load.request_rate=40",
                    "tokenization.workers=2", "tokenization.base_ms=0.5", "tokenization.per_input_us=3",
                    "workload.output_dist=lognormal", "workload.output_std=60"],
    "pd": ["engine=pd_1p2d", "workload.num_requests=300", "load.concurrency=48"],
    "sglang": ["engine.policy=sglang", "workload.num_requests=300", "load.type=gamma", "load.request_rate=30",
               "load.burstiness=0.5"],
}
TABLES = ("requests.parquet", "passes.parquet", "tokens.parquet")


def env(**extra: str) -> dict:
    out = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return {**out, "PYTHONPATH": str(ROOT), **extra}


def replaysim(cwd: Path, *args: str, **extra_env: str) -> None:
    cwd.mkdir(parents=True, exist_ok=True)
    subprocess.run([shutil.which("replaysim"), *args], cwd=cwd, env=env(**extra_env), check=True,
                   capture_output=True, timeout=1800)


def fingerprint(out: Path) -> dict[str, bytes]:
    """The bytes of each result table and of summary.json without its config's output.dir (the runs' own paths)."""
    files = {name: (out / name).read_bytes() for name in TABLES if (out / name).exists()}
    summary = json.loads((out / "summary.json").read_text())
    summary["config"]["output"].pop("dir")
    files["summary.json"] = json.dumps(summary, sort_keys=True).encode()
    return files


def compare(check: str, config: str, a: Path, b: Path) -> bool:
    fa, fb = fingerprint(a), fingerprint(b)
    same = fa.keys() == fb.keys() and all(fa[k] == fb[k] for k in fa)
    differing = [k for k in fa if fa.get(k) != fb.get(k)]
    print(f"{check},{config},{'+'.join(sorted(fa))},{same}{'' if same else ' differ: ' + ' '.join(differing)}",
          flush=True)
    return same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-cold", action="store_true")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="replaysim-determinism-"))
    results = []
    outputs = ["output.passes=true", "output.tokens=true", "seed=7"]
    print("check,config,files,identical")
    try:
        for name, overrides in CONFIGS.items():
            runs = []
            for k in range(2):
                out = base / name / f"twice{k}" / "out"
                replaysim(out.parent, f"output.dir={out}", "hydra.run.dir=run", *outputs, *overrides)
                runs.append(out)
            results.append(compare("same run twice", name, *runs))
            sweeps = {}
            for launcher in ("basic", "joblib"):
                cwd = base / name / launcher
                extra = ["hydra/launcher=local"] if launcher == "joblib" else []
                replaysim(cwd, "-m", "hydra.sweep.dir=multirun", "seed=7,8", "output.tokens=true", *extra, *overrides)
                sweeps[launcher] = cwd / "multirun"
            for point in ("0", "1"):
                results.append(compare(f"basic vs joblib launcher (point {point})", name,
                                       sweeps["basic"] / point, sweeps["joblib"] / point))
        if not args.no_cold:
            name, overrides = "closed-detok", CONFIGS["closed-detok"]
            cold = base / "cold"
            cache = Path(tempfile.mkdtemp(prefix="replaysim-cold-numba-"))
            try:
                replaysim(cold, f"output.dir={cold / 'out'}", "hydra.run.dir=run", *outputs, *overrides,
                          NUMBA_CACHE_DIR=str(cache))
            finally:
                shutil.rmtree(cache, ignore_errors=True)
            results.append(compare("cold vs warm numba cache", name, cold / "out", base / name / "twice0" / "out"))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"{len(results)} determinism checks: {sum(results)} bit-identical")


if __name__ == "__main__":
    main()
