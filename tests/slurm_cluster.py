"""Whether a Slurm cluster answers here: the tests that submit jobs need a node up."""

from __future__ import annotations

import shutil
import subprocess

UP_STATES = {"idle", "mixed", "allocated", "completing"}


def nodes_up() -> bool:
    """True when ``sinfo`` exists and reports at least one node ready for jobs."""
    if shutil.which("sinfo") is None:
        return False
    try:
        # a reachable controller answers at once; without one sinfo retries for ~10 s
        states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return any(state.strip().rstrip("*~#") in UP_STATES for state in states.split())
