"""Megatron-LM training in the cost stack (``[framework] train_backend = "megatron"``): a pass's tensor-parallel
all-reduces, its pipeline's fill and drain and its gradients' data-parallel all-reduce, priced as their closed
forms; layouts that do not divide the GPUs or the layers refused; the terms recovered from synthesised logs; the
shared Megatron log read and calibrated."""

import dataclasses
from pathlib import Path

import pytest

from oppo.sim.cost.stage import StageCost
from oppo.sim.logs.fit import fit_layer, logged_run
from oppo.sim.logs.read import load_run_log
from oppo.sim.setup.toml_file import load_setup
from tests import invoke
from tests.sim.test_floors import assert_predicts_its_own_steps
from tests.sim.test_logfit import families, synthesized_log

DATA = Path(__file__).with_name("data")


def megatron(setup, tp: int, pp: int, vpp: int = 1):
    framework = dataclasses.replace(
        setup.framework,
        train_backend="megatron",
        sharded=False,
        train_tensor_parallel=tp,
        train_pipeline_parallel=pp,
        virtual_pipeline=vpp,
    )
    return dataclasses.replace(setup, framework=framework)


def test_a_megatron_update_is_its_bubbled_compute_plus_its_collectives_at_their_links():
    """deepseek-llm-7b (30 layers, hidden 4096) on 8 MI300X as 2 data-parallel replicas of TP 2 x PP 2, each
    stage 3 virtual chunks: every term by hand."""
    setup = megatron(load_setup("verl-deepseek-llm-7b-ppo-8xmi300x"), tp=2, pp=2, vpp=3)
    cost = setup.costs("sync")["actor"]
    model, fw = cost.base.model, setup.framework
    rows, tokens = 256.0, 256.0 * 300
    replicas, units = 2, 256 // 2 // fw.train_micro_batch  # 8 GPUs / (2 x 2); 16 sequences a micro-batch
    recompute = 4 / 3  # gradient checkpointing
    compute = cost.base.train_s(tokens, 0.0) * recompute * (1 + (2 - 1) / (3 * units))
    activations = tokens / replicas * model.hidden * 2  # bf16
    tp_s = 6 * model.layers / 2 * activations * 2 * (2 - 1) / 2 / cost.tensor_bytes_per_s  # 4 + 2 recomputed
    # verl's Megatron DDP reduces gradients in fp32 (grad_reduce_in_fp32): a ring all-reduce of a GPU's quarter of
    # the parameters at 4 bytes each, 2 (d - 1) / d of it per GPU
    fp32 = 4
    dp_s = model.params / 4 * fp32 * 2 * (replicas - 1) / replicas / cost.collective_bytes_per_s
    assert cost.tensor_bytes_per_s == cost.base.gpu.link_bytes_per_s  # TP within the node
    load = cost._megatron_load(cost.base.train_s(tokens, 0.0) * recompute, tokens, rows, fw.train_micro_batch, 6, True)
    assert load.units == units and load.roofline_s == pytest.approx(compute, rel=1e-12)
    assert load.serial_s == pytest.approx(tp_s + dp_s, rel=1e-12)
    assert load.small_s == pytest.approx(compute / (tokens / replicas / units / 2), rel=1e-12)
    # the distributed optimizer: a reduce-scatter of the fp32 gradients, an all-gather of the bf16 parameters
    sharded = dataclasses.replace(setup, framework=dataclasses.replace(fw, distributed_optimizer=True))
    dist_s = model.params / 4 * (fp32 + 2) * (replicas - 1) / replicas / cost.collective_bytes_per_s
    dist = sharded.costs("sync")["actor"]._megatron_load(
        load.roofline_s / (1 + 1 / (3 * units)), tokens, rows, fw.train_micro_batch, 6, True
    )
    assert dist.serial_s == pytest.approx(tp_s + dist_s, rel=1e-12)
    terms = StageCost(efficiency=0.5, gather_bandwidth_frac=0.25)
    seconds = dataclasses.replace(cost, framework=dataclasses.replace(fw, update_actor=terms)).train_s(
        tokens, 0.0, rows
    )
    assert seconds == pytest.approx(compute / 0.5 + (tp_s + dp_s) / 0.25, rel=1e-9)  # serial: nothing overlaps them


@pytest.mark.parametrize(
    ("tp", "pp", "vpp", "message"),
    [
        (3, 1, 1, "train_tensor_parallel x train_pipeline_parallel = 3 does not divide the actor's 8 GPUs"),
        (2, 4, 2, "train_pipeline_parallel x virtual_pipeline = 8 does not divide the model's 30 layers"),
    ],
)
def test_a_megatron_layout_that_does_not_divide_is_one_line_and_exit_2(tmp_path, tp, pp, vpp, message):
    toml = tmp_path / "m.toml"
    toml.write_text(
        'base = "verl-deepseek-llm-7b-ppo-8xmi300x"\n[framework]\ntrain_backend = "megatron"\nsharded = false\n'
        f"train_tensor_parallel = {tp}\ntrain_pipeline_parallel = {pp}\nvirtual_pipeline = {vpp}\n"
    )
    res = invoke.sim("run", "--setup", toml, "--steps", "1", "--out", tmp_path / "o")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert message in res.stderr


# what a Megatron layer could be: a link at a third of its datasheet, efficiencies off the defaults
TRUTH = families(
    StageCost(efficiency=0.4, per_token_s=2e-5, cache_reinit_s=3.0),
    StageCost(efficiency=0.55, half_efficiency_tokens=2500.0, gather_bandwidth_frac=0.3),
    StageCost(efficiency=0.45, half_efficiency_tokens=4000.0, gather_bandwidth_frac=0.3),
)


def test_the_megatron_terms_are_recovered_from_runs_of_three_layouts():
    """Three runs synthesised from the same terms under TP 2, TP 4 x PP 2 and TP 8 layouts (their collectives
    weigh differently against their compute): one layer fitted across them recovers every term to 5%, the
    collectives' link share included. One run alone cannot split that share from the efficiency (both grow with
    the tokens); it predicts its own steps (the next test)."""
    real = list(load_run_log(DATA / "verl_deepseek_7b_ppo_8xmi300x.csv.gz").steps)[:30]
    base = load_setup("verl-deepseek-llm-7b-ppo-8xmi300x")
    runs = []
    for tp, pp in ((2, 1), (4, 2), (8, 1)):
        setup = dataclasses.replace(megatron(base, tp, pp), name=f"tp{tp}-pp{pp}")
        runs.append(logged_run(setup, synthesized_log(setup, TRUTH, real), 0.9))
    layer = fit_layer(runs)
    for stage, truth in TRUTH.items():
        if stage == "gen":
            continue
        for term in ("efficiency", "half_efficiency_tokens", "gather_bandwidth_frac"):
            assert getattr(layer[stage], term) == pytest.approx(getattr(truth, term), rel=0.05), (stage, term)


@pytest.mark.parametrize("link", [0.5, 1.0, 2.0])
def test_within_run_calibration_of_a_megatron_run_predicts_its_own_steps(link):
    """A Megatron run whose collectives ran at half, all or twice the nominal link (the datasheet's figure is a
    prior, not a floor): within-run, its own steps predicted to 5%. One run cannot tell the link from the
    efficiency (the share stays at its prior, the efficiency takes the rest); its steps say nothing more."""
    real = list(load_run_log(DATA / "verl_deepseek_7b_ppo_8xmi300x.csv.gz").steps)[:40]
    setup = megatron(load_setup("verl-deepseek-llm-7b-ppo-8xmi300x"), 4, 2)
    truth = {k: dataclasses.replace(v, gather_bandwidth_frac=link) if k != "gen" else v for k, v in TRUTH.items()}
    assert_predicts_its_own_steps(setup, synthesized_log(setup, truth, real))


def test_the_shared_megatron_log_calibrates_from_its_launch_command(tmp_path):
    """verl's GRPO run of Qwen2-7B with Megatron TP 4 x PP 2 x VPP 2 on 16 GPUs (its GPU read back from the MFU):
    its setup read from the command, calibrated on 6 of its 11 training steps, the other 5 predicted."""
    log = DATA / "verl_qwen2_7b_grpo_megatron_excerpt.log.gz"
    res = invoke.sim("calibrate-log", "--log", log, "--out", tmp_path / "cal")
    assert res.returncode == 0, res.stderr
    setup = load_setup(str(tmp_path / "cal" / "setup.toml"))
    fw = setup.framework
    assert (fw.train_backend, fw.train_tensor_parallel, fw.train_pipeline_parallel, fw.virtual_pipeline) == (
        "megatron", 4, 2, 2,
    )  # fmt: skip
    import json

    report = json.loads((tmp_path / "cal" / "fidelity.json").read_text())
    assert report["validate_steps"] == 5 and report["step"]["median_abs_err"] <= 0.05
