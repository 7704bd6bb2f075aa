"""The reshard into the rollout engine (verl's hybrid engine loads the trainer's weights into vLLM each step): its
bytes at their links, a prior, and its software per layer, fitted where a log times it apart."""

import dataclasses

import pytest

from oppo.sim.cost.gpu import Cluster
from oppo.sim.cost.stage import StageCost
from oppo.sim.logfit import reshard_load, timed_reshard
from oppo.sim.runlogs import load_run_log
from oppo.sim.setup_toml import load_setup
from tests.sim.test_logfit import DATA


def timed_at(seconds: float, steps: int = 5):
    """The deepseek run's first steps with its reshard timed at ``seconds`` each."""
    real = list(load_run_log(DATA / "verl_deepseek_7b_ppo_8xmi300x.csv.gz").steps)[:steps]
    return [dataclasses.replace(s, stages=s.stages | {"reshard": seconds}) for s in real]


def on_nodes(setup, gpus: int, per_node: int):
    placement = dataclasses.replace(setup.placement, actor_gpus=gpus)
    return dataclasses.replace(setup, placement=placement, cluster=Cluster(gpus_per_node=per_node))


def test_a_timed_reshard_is_its_bytes_at_their_links_and_its_software_per_layer():
    """A reshard slower than its bytes at the nominal links: the bytes at the links (a prior of 1), the rest per
    layer, so the fit gives back the timed seconds."""
    setup = load_setup("verl-deepseek-llm-7b-ppo-8xmi300x")
    load = reshard_load(setup)
    assert 0 < load.reshard_s < 0.1 and load.reshard_layers == 30  # 7B over xGMI; deepseek-llm-7b's 30 layers
    timed = timed_reshard(setup, timed_at(4.0))
    assert timed.frac == 1.0
    assert timed.layer_s == pytest.approx((4.0 - load.reshard_s) / 30, rel=1e-12)
    fitted = StageCost(reshard_frac=timed.frac, reshard_layer_s=timed.layer_s)
    assert fitted.moves_s(load) == pytest.approx(4.0, rel=1e-12)


def test_a_reshard_faster_than_its_bytes_at_the_datasheets_links_has_no_floor_there():
    setup = load_setup("verl-deepseek-llm-7b-ppo-8xmi300x")
    nominal = reshard_load(setup).reshard_s
    timed = timed_reshard(setup, timed_at(nominal / 3))
    assert timed.frac == pytest.approx(3.0, rel=1e-9) and timed.layer_s == 0.0


def test_a_reshard_timed_on_one_node_prices_two_by_their_bytes_not_by_its_software():
    """Timed at 4 s on one node of 8 GPUs, where its bytes at the links take 0.03 s: on two nodes of 8 the gather
    crosses the network cards (50 GB/s a GPU, 9x slower than the node's links), which adds the bytes' seconds over
    them, not 9x the software's (the reshard priced as bytes at a fitted share of the links predicted 37 s)."""
    setup = load_setup("verl-deepseek-llm-7b-ppo-8xmi300x")
    timed = timed_reshard(setup, timed_at(4.0))
    fitted = StageCost(reshard_frac=timed.frac, reshard_layer_s=timed.layer_s)
    two_nodes = reshard_load(on_nodes(setup, gpus=16, per_node=8))
    assert two_nodes.reshard_s > 5 * reshard_load(setup).reshard_s  # the network card's bytes
    assert fitted.moves_s(two_nodes) == pytest.approx(4.0 - reshard_load(setup).reshard_s + two_nodes.reshard_s)
