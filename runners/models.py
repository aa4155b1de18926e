"""``replaysim-models``: the shipped model and GPU catalogue, and whether a model fits a GPU.

``replaysim-models`` lists the catalogue models (layers, width, heads, experts,
parameters, weight and KV bytes) and GPUs (memory, bandwidth, dense TFLOPS per
precision, interconnect); ``--model NAME`` (or a ``config.json`` path) and
``--gpu NAME`` show one model's memory on one GPU at ``--tp`` (weights,
activations at ``--max-tokens``/``--max-sequences``, KV cache and the tokens
it holds), as ``timing.type=roofline`` with ``num_blocks=auto`` would size it.
``--gpu`` alone lists every model's fit on that GPU.

Exit codes: 0 done; 2 an unknown name or bad arguments (one line).
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from simcore.errors import ConfigError
from simcore.models import catalogue
from simcore.models.describe import ModelSpec
from simcore.timing.settings import AIC_MEMORY_FRACTION

PROG = "replaysim-models"


def _model_rows() -> list[str]:
    head = f"{'model':18s} {'layers':>6s} {'hidden':>6s} {'heads':>9s} {'experts':>8s} {'attention':>12s} " \
           f"{'params B':>9s} {'active B':>8s} {'weights GiB':>11s} {'KV KiB/tok':>10s}  dtype"
    rows = [head]
    for name in catalogue.model_names():
        spec = catalogue.model_spec(name)
        rows.append(_model_row(name, spec))
    return rows


def _model_row(name: str, spec: ModelSpec) -> str:
    experts = f"{spec.experts_per_token}/{spec.num_experts}" if spec.num_experts else "-"
    spans = sorted({w for w in spec.windows if w})
    attention = "MLA" if spec.mla else ("GQA" if spec.num_kv_heads < spec.num_heads else "MHA")
    if spans:
        attention += "+win" + ",".join(str(w) for w in spans)
    dtype = spec.linear_dtype if spec.expert_dtype == spec.linear_dtype else f"{spec.linear_dtype}/{spec.expert_dtype}"
    return (
        f"{name:18s} {spec.num_layers:6d} {spec.hidden_size:6d} {spec.num_heads:4d}/{spec.num_kv_heads:<4d} "
        f"{experts:>8s} {attention:>12s} {spec.num_params() / 1e9:9.2f} {spec.active_params_per_token() / 1e9:8.2f} "
        f"{spec.weight_bytes() / catalogue.GIB:11.1f} {spec.kv_bytes_per_token() / 1024:10.1f}  {dtype}"
    )


def _gpu_rows() -> list[str]:
    rows = [f"{'gpu':11s} {'memory GiB':>10s} {'GB/s':>6s} {'bf16 TF':>8s} {'fp8 TF':>7s} {'fp4 TF':>7s}  interconnect"]
    for name in catalogue.gpu_names():
        g = catalogue.gpu(name)

        def tf(precision: str) -> str:
            value = g.tflops.get(precision)
            return "-" if not value else f"{value:g}"

        rows.append(f"{name:11s} {g.memory_gib:10g} {g.bandwidth_gb_per_s:6g} {tf('bf16'):>8s} {tf('fp8'):>7s} "
                    f"{tf('fp4'):>7s}  {g.link} {g.link_gb_per_s:g} GB/s")
    return rows


def fit_line(model: str, gpu: str, tp: int, fraction: float, max_tokens: int, max_sequences: int) -> str:
    """One model's memory on one GPU at ``tp``, as ``timing.type=roofline`` sizes it."""
    spec = catalogue.model_spec(model, key="--model")
    device = catalogue.gpu(gpu, key="--gpu")
    catalogue.check_tp(spec, tp, key="--tp")
    plan = catalogue.memory_plan(spec, device, tp, fraction, max_tokens, max_sequences)
    if not plan.fits:
        return f"{model} on {device.name} x tp {tp}: does not fit: {plan.describe()}"
    tokens = plan.kv / plan.kv_per_token
    return (
        f"{model} on {device.name} x tp {tp}: fits: {plan.describe()}; KV cache {plan.kv / catalogue.GIB:.2f} GiB "
        f"= {tokens:,.0f} tokens at {plan.kv_per_token / 1024:.1f} KiB per token"
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a catalogue model, or a path to a config.json (or its directory)")
    parser.add_argument("--gpu", help="a catalogue GPU")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    parser.add_argument("--memory-fraction", type=float, default=AIC_MEMORY_FRACTION,
                        help=f"share of GPU memory for the engine (default {AIC_MEMORY_FRACTION})")
    parser.add_argument("--max-tokens", type=int, default=8192, help="largest pass, tokens (default 8192)")
    parser.add_argument("--max-sequences", type=int, default=256, help="largest pass, sequences (default 256)")
    args = parser.parse_args(argv)
    try:
        for name, value in (("--tp", args.tp), ("--max-tokens", args.max_tokens),
                            ("--max-sequences", args.max_sequences)):
            if value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        if not 0 < args.memory_fraction <= 1:
            raise ConfigError(f"--memory-fraction must be in (0, 1], got {args.memory_fraction}")
        limits = (args.tp, args.memory_fraction, args.max_tokens, args.max_sequences)
        if args.model and args.gpu:
            lines = [fit_line(args.model, args.gpu, *limits)]
        elif args.gpu:
            catalogue.gpu(args.gpu, key="--gpu")
            lines = []
            for name in catalogue.model_names():
                try:
                    lines.append(fit_line(name, args.gpu, *limits))
                except ConfigError as exc:  # a TP the model's heads refuse
                    lines.append(f"{name}: {exc}")
        elif args.model:
            lines = _model_rows()[:1] + [_model_row(args.model, catalogue.model_spec(args.model, key="--model"))]
        else:
            lines = ["Models (timing.model=<name>; a config.json path works too):", *_model_rows(), "",
                     "GPUs (timing.gpu=<name>; dense tensor-core TFLOPS):", *_gpu_rows()]
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print("\n".join(lines))


if __name__ == "__main__":
    main()
