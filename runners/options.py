"""Every config key documented from where it is declared: ``--help`` and docs/options.md.

The simulation's keys come from the stages' settings dataclasses
(:func:`simcore.checks.describe`: description, unit, allowed values, default),
the runner's from :data:`runners.sweep.RUNNER_KEY_DOCS` and
:data:`runners.capacity.CAPACITY_KEY_DOCS`, the presets from the first
sentence of each preset file's comment.  ``python -m runners.options --write``
writes the help texts (package data, so that ``--help`` prints them in a
fraction of a second without importing Hydra or the kernels) and
docs/options.md; ``tests/test_options.py`` fails when either is stale.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Iterable, NamedTuple

PACKAGE = Path(__file__).resolve().parent
#: ``--help`` of each command, as written by :func:`write`.
HELP_FILES = {"replaysim": PACKAGE / "help" / "replaysim.txt",
              "replaysim-capacity": PACKAGE / "help" / "replaysim-capacity.txt"}
DOCS_FILE = PACKAGE.parent / "docs" / "options.md"
PRESET_GROUPS = ("engine", "workload")
#: The commands the package installs, one line each.
COMMANDS = (
    ("replaysim", "simulate one run, a sweep (-m) or in-job batch axes (sweep.batch.<key>=[...])"),
    ("replaysim-analyze", "tables and plots of a sweep's or a run's results"),
    ("replaysim-capacity", "the highest load meeting an SLO, per configuration of a grid"),
    ("replaysim-calibrate", "fit timing parameters to a measured run (README, Calibration)"),
    ("replaysim-warmup", "compile the kernels into numba's cache ahead of the first run"),
    ("replaysim-models", "the model and GPU catalogue (timing.type=roofline); memory on a GPU"),
)
#: Group headings, in the order of the configuration tree.
GROUPS = (
    ("", "Run"),
    ("workload", "Workload"),
    ("load", "Load"),
    ("engine", "Engine"),
    ("timing", "Timing"),
    ("tokenization", "Tokenization"),
    ("detokenization", "Detokenization"),
    ("metrics", "Metrics"),
    ("output", "Output"),
    ("runner", "Runner (sweeps and result files)"),
    ("capacity", "Capacity search (replaysim-capacity)"),
)
POOL_KEYS = re.compile(r"^engine\.(aggregated|prefill|decode)\.")


class Option(NamedTuple):
    key: str
    default: str
    unit: str
    values: str
    doc: str


def _shown(value: object) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def simulation_options() -> list[Option]:
    """The keys of :class:`simcore.settings.SimConfig`; a pool's keys once, as ``engine.<pool>.*``."""
    from simcore.checks import describe
    from simcore.settings import SimConfig

    options = []
    for doc in describe(SimConfig):
        match = POOL_KEYS.match(doc.path)
        if match and match.group(1) != "aggregated":
            continue
        path = POOL_KEYS.sub("engine.<pool>.", doc.path)
        options.append(Option(path, "null" if doc.default is None else _shown(doc.default), doc.unit, doc.values, doc.doc))
    return options


def runner_options() -> list[Option]:
    """The runner's keys (:data:`runners.sweep.RUNNER_KEY_DOCS`)."""
    from runners.sweep import RUNNER_DEFAULTS, RUNNER_KEY_DOCS

    return [Option(name, _default(RUNNER_DEFAULTS, name), unit, values, doc) for name, unit, values, doc in RUNNER_KEY_DOCS]


def capacity_options() -> list[Option]:
    """The ``capacity.*`` keys of ``replaysim-capacity``."""
    from runners.capacity import CAPACITY_DEFAULTS, CAPACITY_KEY_DOCS

    return [Option(f"capacity.{name}", _default(CAPACITY_DEFAULTS, name), unit, values, doc)
            for name, unit, values, doc in CAPACITY_KEY_DOCS]


def _default(tree: dict, dotted: str) -> str:
    node: object = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return "none"
        node = node[part]
    return "null" if node is None else _shown(node)


def presets() -> dict[str, list[tuple[str, str]]]:
    """Each preset group's ``(name, first sentence of its comment)``, by name."""
    found = {}
    for group in PRESET_GROUPS:
        rows = []
        for path in sorted((PACKAGE / "conf" / group).glob("*.yaml")):
            comment = " ".join(line[1:].strip() for line in path.read_text().splitlines()
                               if line.startswith("#")).strip()
            rows.append((path.stem, _first_sentence(comment)))
        found[group] = rows
    return found


def _first_sentence(text: str) -> str:
    """Up to the first full stop outside parentheses (without it)."""
    depth = 0
    for i, char in enumerate(text):
        depth += (char == "(") - (char == ")")
        if char == "." and depth == 0 and (i + 1 == len(text) or text[i + 1] == " "):
            return text[:i]
    return text


def _group_of(option: Option) -> str:
    head = option.key.split(".", 1)[0]
    if option.key.startswith("capacity."):
        return "capacity"
    if head in ("force", "sweep", "export"):
        return "runner"
    return head if "." in option.key else ""


def _grouped(options: Iterable[Option]) -> list[tuple[str, str, list[Option]]]:
    by_group: dict[str, list[Option]] = {}
    for option in options:
        by_group.setdefault(_group_of(option), []).append(option)
    return [(name, title, by_group[name]) for name, title in GROUPS if name in by_group]


def _section_doc(name: str) -> str:
    """The description of a top-level section of the simulation's settings ("" for the others)."""
    from simcore.checks import section_doc
    from simcore.settings import SimConfig

    return section_doc(SimConfig, name) if name in SimConfig.__dataclass_fields__ else ""


def _wrapped(text: str, indent: str, width: int = 100, hanging: str | None = None) -> list[str]:
    lines, line = [], indent
    for word in text.split():
        if len(line) + len(word) + 1 > width and line.strip():
            lines.append(line.rstrip())
            line = indent if hanging is None else hanging
        line += word + " "
    if line.strip():
        lines.append(line.rstrip())
    return lines


def help_text(command: str = "replaysim") -> str:
    """The ``--help`` of ``replaysim`` or ``replaysim-capacity``: usage, commands, presets, every key."""
    options = simulation_options() + runner_options()
    if command == "replaysim-capacity":
        options += capacity_options()
    out = [
        f"{command}: simulate LLM serving engines; set any key below on the command line as key=value.",
        "",
        f"usage: {command} [key=value ...]" + ("   (-m for a sweep: key=a,b,c)" if command == "replaysim" else ""),
        f"       {command} --cfg job [key=value ...]   print the composed config",
        f"       {command} --hydra-help                 Hydra's own flags (launchers, sweeps, run directories)",
        f"       {command} --version",
        "",
        "Commands:",
        *(f"  {name:<21}{what}" for name, what in COMMANDS),
        "",
        "Presets (pick one per group by name, e.g. engine=pd_1p2d workload=mooncake_sample):",
    ]
    for group, rows in presets().items():
        out.append(f"{group}: {', '.join(name for name, _ in rows)}")
        for name, what in rows:
            out.extend(_wrapped(f"{group}={name}: {what}", "  ", hanging="      "))
    out += ["", "Keys (default; unit; allowed values). Full descriptions: docs/options.md."]
    for name, title, rows in _grouped(options):
        out += ["", f"{title}:"]
        out.extend(_wrapped(_section_doc(name), "  "))
        for option in rows:
            facts = "; ".join(part for part in (f"default {option.default}", option.unit, option.values) if part)
            out.extend(_wrapped(f"{option.key} ({facts})", "  ", hanging="        "))
            out.extend(_wrapped(option.doc, "      "))
    return "\n".join(out) + "\n"


def markdown() -> str:
    """docs/options.md: every key of every command in tables, grouped as ``--help`` groups them."""
    out = [
        "# Options",
        "",
        "Every configuration key, generated from where each is declared and checked",
        "(`python -m runners.options --write`; `tests/test_options.py` fails when this",
        "page is stale). Set a key on the command line as `key=value`; `null` is YAML's",
        "none. `engine.<pool>` stands for `engine.aggregated` (the default mode) and, with",
        "`engine.mode=disaggregated`, `engine.prefill` and `engine.decode`.",
        "",
        "## Commands",
        "",
        "| command | what it does |",
        "| --- | --- |",
        *(f"| `{name}` | {what} |" for name, what in COMMANDS),
        "",
        "## Presets",
        "",
        "| preset | what it selects |",
        "| --- | --- |",
    ]
    for group, rows in presets().items():
        out.extend(f"| `{group}={name}` | {what} |" for name, what in rows)
    for name, title, rows in _grouped(simulation_options() + runner_options() + capacity_options()):
        out += ["", f"## {title}", ""]
        if _section_doc(name):
            out += [_section_doc(name), ""]
        out += ["| key | default | unit | allowed | description |", "| --- | --- | --- | --- | --- |"]
        for option in rows:
            cells = (f"`{option.key}`", f"`{option.default}`", option.unit, option.values, option.doc)
            out.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(out) + "\n"


def print_help(command: str) -> None:
    """Print the written ``--help`` of ``command`` (no Hydra, no kernels imported)."""
    sys.stdout.write(HELP_FILES[command].read_text(encoding="utf-8"))
    sys.stdout.flush()


def generated() -> dict[Path, str]:
    """Each generated file and what it should hold."""
    files = {path: help_text(command) for command, path in HELP_FILES.items()}
    files[DOCS_FILE] = markdown()
    return files


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m runners.options", description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="write the help texts and docs/options.md")
    args = parser.parse_args()
    for path, text in generated().items():
        if args.write:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if not args.write:
        sys.stdout.write(help_text())


if __name__ == "__main__":
    main()
