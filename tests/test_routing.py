"""Routing over workers and ranks (docs/routing.md): against the reference, hand-worked cases, laws."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import simcore
from simcore.config import ConfigError, load_config
from simcore.engine.router import RECEIVING_STREAM, route_draws
from tests.scenarios import routing_scenario
from tests.test_against_reference import compare_with_reference

NUM_ROUTING_SCENARIOS = 200  # per receiving policy; a third of them disaggregated
NUM_RANK_SCENARIOS = 200  # round robin over workers, least-loaded ranks
NUM_DECODE_SCENARIOS = 200  # P/D, per decode policy family
RECEIVING_POLICIES = ["random", "least_outstanding", "least_tokens", "power_of_two", "prefix_aware"]


@pytest.mark.parametrize("policy", RECEIVING_POLICIES)
@pytest.mark.parametrize("seed", range(NUM_ROUTING_SCENARIOS))
def test_routing_matches_reference(policy, seed):
    compare_with_reference(routing_scenario(seed, policy, disaggregated=seed % 3 == 2))


@pytest.mark.parametrize("seed", range(NUM_RANK_SCENARIOS))
def test_least_loaded_ranks_match_reference(seed):
    compare_with_reference(
        routing_scenario(seed, "round_robin", disaggregated=seed % 3 == 2, rank_policy="least_loaded")
    )


@pytest.mark.parametrize("decode_policy", ["least_outstanding", "least_tokens", "power_of_two"])
@pytest.mark.parametrize("seed", range(NUM_DECODE_SCENARIOS // 2))
def test_decode_routing_matches_reference(decode_policy, seed):
    compare_with_reference(routing_scenario(seed, "round_robin", disaggregated=True, decode_policy=decode_policy))
