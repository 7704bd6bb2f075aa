"""The reshard into the rollout engine (verl's hybrid engine loads the trainer's weights into vLLM each step): its
bytes at their links, a prior, and its software per layer, fitted where a log times it apart."""

import dataclasses
from types import SimpleNamespace

import pytest

from oppo.sim.cost.gpu import Cluster
from oppo.sim.cost.stage import StageCost
from oppo.sim.logs.fit import MAX_SHARE, _timed_reshards, reshard_load, timed_reshard
from oppo.sim.logs.read import TrainingLog, load_run_log
from oppo.sim.setup.toml_file import load_setup
from tests.sim.test_logfit import DATA, synthesized_log, within_run


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


def test_a_reshard_timed_on_one_node_prices_other_nodes_by_their_bytes_not_by_its_software():
    """Timed at 4 s on one node of 8 GPUs, where its bytes at the links take 0.05 s: on 8 nodes of 2 the gather
    crosses the network cards (two a node, 100 GB/s a GPU, 4.5x slower than the node's links), which adds the
    bytes' seconds over them, not 4.5x the software's: the reshard priced as bytes at the share its timing gives
    would take 16 s."""
    setup = load_setup("verl-deepseek-llm-7b-ppo-8xmi300x")
    one_node, spread = reshard_load(setup), reshard_load(on_nodes(setup, gpus=16, per_node=2))
    assert spread.reshard_s > 3 * one_node.reshard_s  # the network cards' bytes
    timed = timed_reshard(setup, timed_at(4.0))
    fitted = StageCost(reshard_frac=timed.frac, reshard_layer_s=timed.layer_s)
    assert fitted.moves_s(spread) == pytest.approx(4.0 - one_node.reshard_s + spread.reshard_s, rel=1e-12)
    assert StageCost(reshard_frac=one_node.reshard_s / 4.0).moves_s(spread) > 12.0  # a share of the links


def test_an_fsdp_trainers_reshard_gathers_its_float32_parameters():
    """verl loads an FSDP actor in float32 (mixed precision casts it for compute) and gathers those shards whole
    for the engine: 4 bytes a parameter over the links, then the engine's bf16 weights written over HBM."""
    setup = load_setup("verl-deepseek-llm-7b-ppo-8xmi300x")
    actor = setup.costs("sync")["actor"]
    model, n, tp = actor.base.model, actor.base.n_gpus, actor.base.tensor_parallel
    gather_s = 4 * model.params * (n - 1) / n / actor.collective_bytes_per_s
    write_s = 2 * model.weight_bytes / tp / actor.base.gpu.hbm_bytes_per_s
    assert actor.reshard_s() == pytest.approx(gather_s + write_s, rel=1e-12)


def test_sleep_modes_wake_up_is_timed_in_the_reshard_and_priced_once():
    """verl's reshard timer holds sleep mode's wake-up (the weights' copy back from the host, half its moves; the
    sleep after generation is outside it): a timed reshard's software per layer is what is left after the bytes
    and the wake-up at their links, so the reshard is predicted as timed and ``gen`` pays the wake-up once, with
    sleep's moves."""
    setup = load_setup("verl-deepseek-llm-7b-ppo-8xmi300x")
    setup = dataclasses.replace(setup, framework=dataclasses.replace(setup.framework, kv_cache_reset="sleep"))
    load, moves = reshard_load(setup), setup.costs("sync")["actor"].step_load("gen")
    assert load.transfer_s == pytest.approx(moves.transfer_s / 2) and load.transfer_s > 0.05  # 7B over PCIe 5.0
    timed = timed_reshard(setup, timed_at(4.0))
    assert timed.layer_s == pytest.approx((4.0 - load.transfer_s - load.reshard_s) / 30, rel=1e-12)
    fitted = StageCost(reshard_frac=timed.frac, reshard_layer_s=timed.layer_s)
    assert fitted.moves_s(load) == pytest.approx(4.0, rel=1e-12)  # the reshard as timed
    assert fitted.moves_s(moves) == pytest.approx(4.0 + moves.transfer_s / 2, rel=1e-12)  # + the sleep's half


def test_an_offloaded_actors_copies_are_timed_in_the_reshard_at_the_host_link():
    """verl's sharding manager copies an offloaded actor's float32 shard in before the reshard and back out after,
    inside its timer: the reshard as timed holds them with sleep mode's wake-up (half its moves), as host-link
    seconds (``transfer_s``), not at the reshard's gather link; ``gen`` pays them once with sleep's moves."""
    setup = load_setup("verl-deepseek-llm-7b-ppo-8xmi300x")
    fw = dataclasses.replace(setup.framework, kv_cache_reset="sleep", offload=("actor", "reference"))
    offloaded = dataclasses.replace(setup, framework=fw)
    kept = dataclasses.replace(setup, framework=dataclasses.replace(fw, offload=("reference",)))
    actor = offloaded.costs("sync")["actor"]
    n, host = actor.base.n_gpus, actor.base.gpu.host_link_bytes_per_s
    round_trip = 2 * 4 * actor.base.model.params / n / host
    sleep = kept.costs("sync")["actor"].step_load("gen").transfer_s
    assert reshard_load(offloaded).transfer_s == pytest.approx(sleep / 2 + round_trip, rel=1e-12)
    assert reshard_load(offloaded).reshard_s == reshard_load(kept).reshard_s
    assert actor.step_load("gen").transfer_s == pytest.approx(sleep + round_trip, rel=1e-12)


def test_a_reshard_the_log_times_apart_is_fitted_apart():
    """verl 2025 times the reshard into vLLM (``timing_s/reshard``, inside ``gen``): its bytes at the nominal links,
    the rest its software per layer (100 times the bytes' seconds here), generation's other terms fitted on the
    rest of ``gen``; the reshard is reported as a stage of its own but not added to the step."""
    real = list(load_run_log(DATA / "verl_deepseek_7b_ppo_8xmi300x.csv.gz").steps)[:30]
    setup = load_setup("verl-deepseek-llm-7b-ppo-8xmi300x")
    truth = {"gen": StageCost(efficiency=0.4, per_token_s=2e-5, cache_reinit_s=3.0, reshard_frac=0.01)}
    log = synthesized_log(setup, truth, real)
    costs = setup.costs("sync")
    reshard_s = costs["actor"].reshard_s() / 0.01
    log = TrainingLog(
        log.source, tuple(dataclasses.replace(s, stages=s.stages | {"reshard": reshard_s}) for s in log.steps)
    )
    fitted, report = within_run(setup, log)
    layers = costs["actor"].step_load("gen").reshard_layers
    assert fitted.framework.gen.reshard_frac == 1.0
    assert fitted.framework.gen.reshard_layer_s == pytest.approx(0.99 * reshard_s / layers, rel=1e-9)
    assert fitted.framework.gen.cache_reinit_s == pytest.approx(3.0, rel=0.05)
    assert report["stages"]["reshard"]["median_abs_err"] < 1e-9
    assert report["step"]["median_abs_err"] < 0.01  # the step counts gen once, the reshard inside it


def test_a_reshard_timed_under_its_wake_up_at_the_nominal_link_is_all_bytes_at_the_largest_share():
    """Timed at less than sleep mode's wake-up at the nominal host link alone: nothing is left for the bytes, whose
    share is the largest a fit gives (the links' figures are no floor), and no software per layer."""
    setup = load_setup("verl-deepseek-llm-7b-ppo-8xmi300x")
    setup = dataclasses.replace(setup, framework=dataclasses.replace(setup.framework, kv_cache_reset="sleep"))
    wake_up = reshard_load(setup).transfer_s
    timed = timed_reshard(setup, timed_at(wake_up / 2))
    assert timed.frac == MAX_SHARE and timed.layer_s == 0.0


def test_runs_that_time_the_reshard_share_one_split():
    """Several runs timing the reshard: one split for all, the median over runs of the software per layer (bytes at
    the links), or where that is none, the median share."""
    setup = load_setup("verl-deepseek-llm-7b-ppo-8xmi300x")
    nominal = reshard_load(setup).reshard_s
    runs = [SimpleNamespace(setup=setup, log=SimpleNamespace(steps=timed_at(t)), n_fit=5) for t in (1.0, 4.0, 7.0)]
    joint = _timed_reshards(runs, whole=False)
    assert joint.frac == 1.0 and joint.layer_s == pytest.approx((4.0 - nominal) / 30, rel=1e-12)
    fast = [SimpleNamespace(setup=setup, log=SimpleNamespace(steps=timed_at(nominal / k)), n_fit=5) for k in (2, 3, 5)]
    joint = _timed_reshards(fast, whole=False)
    assert joint.frac == pytest.approx(3.0, rel=1e-9) and joint.layer_s == 0.0


def test_a_log_that_times_a_reshard_its_setup_cannot_pay_is_refused():
    setup = load_setup("verl-deepseek-llm-7b-ppo-8xmi300x")
    bare = dataclasses.replace(setup, framework=dataclasses.replace(setup.framework, weight_reshard=False))
    with pytest.raises(ValueError, match="declares no resharding: set \\[framework\\] weight_reshard"):
        timed_reshard(bare, timed_at(4.0))
    split = dataclasses.replace(setup, placement=dataclasses.replace(setup.placement, rollout_gpus=4))
    with pytest.raises(ValueError, match="GPUs of its own"):
        timed_reshard(split, timed_at(4.0))
