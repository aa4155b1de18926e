"""The override check composes Hydra's config on trial only for hydra.* overrides that could fail inside it."""

import pytest

from runners import cli


@pytest.fixture
def compositions(monkeypatch):
    made = []

    class Loader:
        def load_configuration(self, config_name, overrides, run_mode):
            made.append(list(overrides))

    monkeypatch.setattr(cli, "_config_loader", lambda: Loader())
    return made


@pytest.mark.parametrize("argv", [
    ["hydra.run.dir=out"], ["hydra.sweep.dir=sweeps", "hydra.sweep.subdir=${hydra.job.num}"],
    ["hydra.job.name=x", "load.concurrency=4"], ["hydra.run.dir=${nope}"],
])
def test_a_plain_change_of_a_run_directory_needs_no_trial(argv, compositions):
    assert cli.override_problem(argv) is None
    assert compositions == []


@pytest.mark.parametrize("argv", [
    ["hydra.sweeper.params.x=1"], ["+hydra.run.dir=out"], ["hydra.run.dir=a,b"], ["~hydra.job.name"],
    ["hydra.run.dir=out", "hydra.verbose=true"],
])
def test_other_hydra_overrides_are_tried(argv, compositions):
    assert cli.override_problem(argv) is None
    assert compositions and all(not text.startswith("hydra.run.dir=out") for text in compositions[0])
