"""Plot two ``replaysim-capacity`` results, without and with speculative decoding (docs/speculative.md).

Usage: python bench/plot_capacity_speculative.py OFF_DIR ON_DIR [--out docs/img/capacity_speculative.png]
Each directory is a ``replaysim-capacity`` ``output.dir`` (its ``capacity.parquet``); prints one CSV
line per configuration (case, config_id, capacity, tok/s/GPU, tok/s/user) and writes the plot:
capacity per configuration, and tokens/s per GPU against tokens/s per user at capacity.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("off")
    parser.add_argument("on")
    parser.add_argument("--out", default="docs/img/capacity_speculative.png")
    args = parser.parse_args()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    print("case,config_id,replicas,capacity,tok_s_gpu,tok_s_user")
    for label, directory, color in (("without", args.off, "tab:blue"), ("EAGLE-3, k=3, tau=2.5", args.on, "tab:red")):
        rows = sorted(pq.read_table(Path(directory) / "capacity.parquet").to_pylist(),
                      key=lambda row: row["engine.aggregated.replicas"])
        replicas = [row["engine.aggregated.replicas"] for row in rows]
        for row in rows:
            print(f"{label},{row['config_id']},{row['engine.aggregated.replicas']},{row['capacity']},"
                  f"{row['output_tokens_per_s_per_gpu']:.1f},{row['output_tokens_per_s_per_user']:.2f}")
        left.plot(replicas, [row["capacity"] for row in rows], "o-", color=color, label=label)
        right.plot([row["output_tokens_per_s_per_user"] for row in rows],
                   [row["output_tokens_per_s_per_gpu"] for row in rows], "o", color=color, label=label)
        for row in rows:
            right.annotate(f"{row['engine.aggregated.replicas']}x", (row["output_tokens_per_s_per_user"],
                                                                    row["output_tokens_per_s_per_gpu"]), fontsize=8)
    left.set(xlabel="replicas", ylabel="capacity (req/s) under the SLO", title="capacity")
    right.set(xlabel="tokens/s per user", ylabel="tokens/s per GPU", title="at capacity")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
