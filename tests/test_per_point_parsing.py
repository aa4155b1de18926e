"""Shortcuts of the per-point work of a sweep give what the long way gives."""

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from simcore.config import DEFAULTS, dotted_keys, merge_config
from runners.params import group_choices

LINES = [
    "engine=pd_1p2d", "workload=chat", "load.concurrency=4", "load.concurrency==4", "engine.policy=sglang",
    "+engine=h100", "~max_time_ms", "engine@x=h100", "timing.type=linear", "load=[", "a..b=1", "hydra/launcher=local",
    "detokenization.base_ms=2.85", "workload.source=azure", "seed=3", "sweep.batch.seed=[0,1]", "engine.aggregated=x",
]


def _choices_parsing_every_line(lines):
    parser, leaves, choices = OverridesParser.create(), set(dotted_keys()), {}
    sections = {leaf.rsplit(".", i)[0] for leaf in leaves for i in range(1, leaf.count(".") + 1)}
    for line in lines:
        try:
            (override,) = parser.parse_overrides([line])
        except HydraException:
            continue
        key, value = override.key_or_group, override.value()
        if isinstance(value, str) and key not in leaves and (key in leaves or key in sections):
            choices[key] = value
    return choices


def test_group_choices_equal_hydras_parse_of_every_line():
    for start in range(len(LINES)):
        lines = LINES[start:] + LINES[:start]
        assert group_choices(lines) == _choices_parsing_every_line(lines)


def test_merged_defaults_are_an_unshared_copy():
    merged = merge_config(None)
    assert merged == DEFAULTS

    def containers(tree):
        if isinstance(tree, (dict, list)):
            yield tree
            for value in tree.values() if isinstance(tree, dict) else tree:
                yield from containers(value)

    assert not {id(c) for c in containers(merged)} & {id(c) for c in containers(DEFAULTS)}
