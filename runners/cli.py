"""The ``replaysim`` command: Hydra overrides -> :func:`simcore.run` -> result files.

Bad input (an unknown key, an invalid value, a bad request table) prints one
line ``replaysim: error: ...`` on stderr and exits with code 2 before anything
is written (SPEC §11).
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path
from typing import NoReturn, Sequence

import hydra
from hydra._internal.utils import get_args_parser
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

import simcore
import runners.conf_store  # noqa: F401  (registers base_config before Hydra composes)
from runners.report import format_summary
from runners.writer import write_results
from simcore.config import ConfigError, SimConfig, dotted_keys, load_config

PROG = "replaysim"
#: ``conf/`` at the repository top level, as an absolute path: with a relative
#: ``config_path="../conf"`` Hydra looks for a package ``conf`` whenever the task
#: module is imported by name (the console script) rather than run as ``__main__``.
CONFIG_DIR = Path(__file__).resolve().parent.parent / "conf"
EXIT_BAD_INPUT = 2


def fail(message: object) -> NoReturn:
    """Print ``replaysim: error: <message>`` as one stderr line and exit 2.

    Parameters
    ----------
    message : object
        The error (its ``str`` is printed, newlines folded).

    Raises
    ------
    SystemExit
        Always, with code 2 (Hydra's ``run_and_report`` lets it through).
    """
    text = " ".join(line.strip() for line in str(message).splitlines())
    print(f"{PROG}: error: {text}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_BAD_INPUT)


def unknown_key_message(key: str) -> str | None:
    """Why the override key ``key`` is not a config key, or None if it is one.

    Parameters
    ----------
    key : str
        A dotted key (``engine.aggregated.replicas``); a section such as
        ``metrics.goodput`` is a key too.

    Returns
    -------
    str or None
        The error message, with a close match and the keys allowed next to it.
    """
    leaves = dotted_keys()
    sections = {leaf.rsplit(".", i)[0] for leaf in leaves for i in range(1, leaf.count(".") + 1)}
    if key in sections or key in leaves:
        return None
    parent = key.rpartition(".")[0]
    while parent and parent not in sections:
        parent = parent.rpartition(".")[0]
    prefix = f"{parent}." if parent else ""
    siblings = sorted({k[len(prefix):].split(".")[0] for k in leaves if k.startswith(prefix)})
    where = f"under {parent}" if parent else "at the top level"
    candidates = [k for k in (*leaves, *sections) if not key.startswith(f"{k}.")]
    hint = difflib.get_close_matches(key, candidates, n=1, cutoff=0.85)
    guess = f"did you mean {hint[0]}? " if hint else ""
    return f"{key} is not a known config key ({guess}known keys {where}: {', '.join(siblings)})"


def check_overrides(argv: Sequence[str]) -> None:
    """Reject an override of an unknown config key before Hydra sees it.

    Parameters
    ----------
    argv : sequence of str
        The command-line arguments (without the program name).

    Notes
    -----
    Only ``key=value``, ``+key=value``, ``++key=value`` and ``~key`` overrides of
    non-``hydra`` keys are checked; options, group overrides
    (``hydra/launcher=joblib``) and overrides Hydra cannot parse are left to
    Hydra, whose own composition errors exit with code 1.
    """
    overrides = get_args_parser().parse_args(list(argv)).overrides
    parser = OverridesParser.create()
    for line in overrides:
        try:
            (override,) = parser.parse_overrides([line])
        except HydraException:
            continue
        key = override.key_or_group
        if override.is_hydra_override() or override.package is not None or "/" in key:
            continue
        message = unknown_key_message(key)
        if message is not None:
            fail(message)


def output_dir(config: SimConfig) -> Path:
    """The run's output directory.

    Parameters
    ----------
    config : SimConfig
        The validated configuration.

    Returns
    -------
    Path
        ``output.dir`` (a relative path is taken from the launch directory) if
        set, else the Hydra job's output directory.
    """
    if config.output.dir is not None:
        return Path(to_absolute_path(config.output.dir))
    return Path(HydraConfig.get().runtime.output_dir)


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="config")
def task(cfg: DictConfig) -> None:
    """Validate the composed config, simulate, write the results, print a summary.

    Parameters
    ----------
    cfg : DictConfig
        The composed Hydra config (without the ``hydra`` node).
    """
    try:
        mapping = OmegaConf.to_container(cfg, resolve=True)
        mapping.pop("hydra", None)
        config = load_config(mapping)
    except OmegaConfBaseException as exc:  # e.g. a broken ${...} interpolation
        fail(f"{exc.full_key}: {str(exc).splitlines()[0]}")
    except ValueError as exc:  # ConfigError is a ValueError
        fail(exc)
    out_dir = output_dir(config)
    try:
        result = simcore.run(config)
    except ConfigError as exc:  # a bad request table or trace
        fail(exc)
    write_results(result, out_dir)
    print(format_summary(result.summary, out_dir), flush=True)


def main() -> None:
    """Console-script entry point: check override keys, then run the Hydra app."""
    check_overrides(sys.argv[1:])
    task()


if __name__ == "__main__":
    main()
