"""A setup whose GPU its log does not name (``gpu = "unknown"``): the peak verl assumed, read back from the log's MFU
(oppo/sim/logs/device.py), and the ``[gpu_spec]`` table that carries it."""

import csv
import dataclasses
import gzip
from pathlib import Path

import pytest

from oppo.core.config import to_dict
from oppo.sim.cost.gpu import Efficiency
from oppo.sim.logs.device import prior_gpu, read_back_peak, resolve_gpu, verl_family
from oppo.sim.logs.read import load_run_log
from oppo.sim.setup.presets import GpuSpec
from oppo.sim.setup.toml_file import load_setup, setup_from_dict, setup_toml
from tests import invoke

DATA = Path(__file__).parent / "data"
GPG_LOG = DATA / "verl_qwen2_7b_gpg.log.gz"
GPG = "verl-qwen2-7b-gpg-8gpu"
MI300X_CSV = DATA / "verl_deepseek_7b_ppo_8xmi300x.csv.gz"
FIGURES = "hbm_bytes_per_s = 3e12\npeak_flops = 5e14"  # of a [gpu_spec] table


def sim(*args):
    return invoke.sim(*args)


def one_line_error(res) -> str:
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


def verl_flops(tokens: float, seqlens: list[float]) -> float:
    """verl's flops counter for Qwen2-7B (verl/utils/flops_counter.py, written out from the published config):
    6 x the dense weights (embedding and LM head both) per token, 12 x seqlen² x heads x head width x layers."""
    layers, hidden, heads, kv_heads, mlp, vocab = 28, 3584, 28, 4, 18944, 152064
    width = hidden // heads
    dense = (3 * hidden * mlp + hidden * (2 * heads + 2 * kv_heads) * width) * layers + 2 * vocab * hidden
    return 6 * dense * tokens + 12 * sum(s * s for s in seqlens) * width * heads * layers


@pytest.mark.parametrize("trainer_steps", [1, 4])
def test_the_peak_reads_back_from_a_log_made_with_it(tmp_path, trainer_steps):
    """A log whose MFU verl would print on a 750 TFLOP/s device (equal-length sequences, so the attention term is
    exact): the peak reads back to 1e-9, with the setup's sequences, GPUs and PPO epochs (2 here) as the run's. So
    does a fully async trainer's, whose rows sum 4 trainer steps' seconds and tokens (the MFU their mean) and do
    not log the prompt's length (the token count gives it)."""
    setup = dataclasses.replace(load_setup(GPG), ppo_epochs=2)
    n, gpus, peak, prompt, response = 1024 * 5, 8, 750e12, 100, 300
    rows = []
    for step, update_s in enumerate((120.0, 131.5, 127.25), 1):
        tokens = n * (prompt + response)
        mfu = verl_flops(tokens, [prompt + response] * n) * 2 / (update_s * gpus * peak)
        row = dict(
            step=step,
            timing_s_gen=60.0 * trainer_steps,
            timing_s_update_actor=update_s * trainer_steps,
            response_length_mean=response,
            response_length_max=response,
            response_length_min=response,
            prompt_length_mean=prompt,
            total_num_tokens=tokens * trainer_steps,
            mfu_actor=mfu,
            max_memory_reserved_gb=70.5,
        )
        if trainer_steps > 1:
            del row["prompt_length_mean"]
            row |= dict(training_global_step=step * trainer_steps, fully_async_count_current_param_version=step - 1)
        rows.append(row)
    path = tmp_path / "steps.csv"
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    log = load_run_log(path)
    read, n_steps = read_back_peak(setup, log)
    assert n_steps == 3 and read == pytest.approx(peak, rel=1e-9)
    resolved = resolve_gpu(setup, log)
    assert resolved.gpu_spec.peak_flops == pytest.approx(peak, rel=1e-9)
    assert resolved.gpu_spec.memory_bytes >= 70.5 * 2**30  # at least what the log reserved
    # 750 TFLOP/s is no catalog GPU's peak: the default fractions of the datasheet, not a neighbour's fitted ones
    assert resolved.gpu_spec.efficiency_of == "" and resolved.cost == "analytic"


def test_real_logs_read_back_verl_s_table():
    """The GPG run's step lines read back 312 TFLOP/s (verl's figure for A100 / A800) and the MI300X run's 1336
    (verl's MI300X figure), each 0-5% low: the logged update seconds include the batch's transfer to the workers,
    which verl's own timer of the update leaves out."""
    gpg, n_gpg = read_back_peak(load_setup(GPG), load_run_log(GPG_LOG))
    assert n_gpg == 168 and 0.95 * 312e12 <= gpg <= 1.005 * 312e12
    mi300x, _ = read_back_peak(load_setup("verl-deepseek-llm-7b-ppo-8xmi300x"), load_run_log(MI300X_CSV))
    assert 0.95 * 1336e12 <= mi300x <= 1.005 * 1336e12


def test_a_device_read_back_at_a_catalog_gpus_peak_is_priced_with_that_gpus_fitted_efficiencies():
    """The GPG run reads back verl's A100 / A800 peak: its device takes the A100's fitted fractions (as a run on a
    named A100 would, so one framework layer prices both alike), on its own read-back peak and logged memory."""
    from oppo.sim.cost.gpu import gpu_efficiencies

    resolved = resolve_gpu(load_setup(GPG), load_run_log(GPG_LOG))
    assert resolved.gpu_spec.efficiency_of == "a100" and resolved.cost == "fitted"
    base = resolved.costs()["actor"].base
    assert base.efficiency == gpu_efficiencies()["a100"].efficiency
    assert base.gpu.peak_flops == resolved.gpu_spec.peak_flops < 312e12


@pytest.mark.parametrize(
    "peak, reserved_gb, expected",
    [
        (989e12, 70, "h100"),
        (989e12, 90, "gh200"),
        (989e12, 130, "h200"),
        (310.6e12, 113.6, "a100"),
        (1336e12, 150, "mi300x"),
    ],
)
def test_of_gpus_that_promise_one_peak_the_prior_is_the_smallest_that_holds_the_logged_memory(
    peak, reserved_gb, expected
):
    """verl promises 989 TFLOP/s for H100, H200 and GH200 alike: a log that reserved 70 GB is priced as an H100, not
    with an H200's bandwidth; where no GPU of the peak holds what was reserved (the GPG run's 113.6 GB at the A100's
    peak), the largest one."""
    assert prior_gpu(peak, reserved_gb * 1e9).name == expected


@pytest.mark.parametrize(
    "peak, reserved_gb, family",
    [
        (148e12 * 0.999, 70, ("h20",)),  # near the A40's 149.7 too, but an A40 cannot hold 70 GB
        (148e12 * 0.999, 40, ()),  # an H20 or an A40: verl's table cannot say which
        (149.7e12 * 0.985, 40, ()),
        (149.7e12 * 0.999, 40, ("a40",)),  # above H20's 148 by more than a read-back ever reads high
        (1336e12 * 0.995, 150, ("mi300x",)),
        (989e12 * 0.96, 70, ("h100", "h800", "h200", "gh200")),
        (312e12 * 0.996, 113.6, ("a100", "a800", "a100-40gb")),  # the GPG run: one entry, whatever its memory says
        (354e12, 60, ()),  # verl's Ascend 910B: no catalog GPU, though the L40S's 362.05 is 2% away
        (119.5e12, 40, ("l20",)),  # verl's L20
        (989e12 * 0.94, 70, ()),  # further below verl's figure than a read-back reads
    ],
)
def test_a_read_back_peak_names_a_catalog_family_only_at_verls_entry_for_it(peak, reserved_gb, family):
    """A peak read back from verl's MFU is the entry of verl's flops table the device's name matched: it identifies
    the catalog GPUs of that entry (whose fitted efficiencies the device then takes), and no GPU whose peak lies near
    it by chance; where two entries lie within a read-back's error, the memory the log reserved tells them apart
    or nothing does."""
    assert verl_family(peak, reserved_gb * 1e9) == family
    if family:
        assert prior_gpu(peak, reserved_gb * 1e9).name in family


def test_a_log_that_shows_no_memory_takes_the_part_verls_table_names_first():
    """The GPG run's Megatron twin logs no reserved memory: at verl's A100 figure it is priced as the A100 80GB (the
    table's first part, as its FSDP twin on the same box), not as the least memory of the family (the A100 40GB's
    bandwidth, which it took before); at the H100 figure the H100."""
    assert prior_gpu(312e12 * 0.985, 0.0).name == "a100"
    assert prior_gpu(989e12 * 0.99, 0.0).name == "h100"
    assert prior_gpu(119.5e12 * 0.97, 0.0).name == "l20"


def test_a_gpu_spec_over_a_catalog_gpu_keeps_its_fitted_efficiencies(tmp_path):
    """A setup that names a catalog GPU and overrides its figures with a [gpu_spec] is priced with that GPU's fitted
    fractions of them."""
    from oppo.sim.cost.gpu import gpu_efficiencies

    spec = '[gpu_spec]\nname = "h100"\nhbm_bytes_per_s = 3e12\npeak_flops = 9e14\nmemory_bytes = 8e10\n'
    (tmp_path / "s.toml").write_text(f'base = "paper-7b-h200"\ngpu = "h100"\n{spec}link_bytes_per_s = 4e11\n')
    base = load_setup(str(tmp_path / "s.toml")).costs()["actor"].base
    assert base.gpu.peak_flops == 9e14 and base.efficiency == gpu_efficiencies()["h100"].efficiency


def test_a_log_without_mfu_or_tokens_exits_2(tmp_path):
    log = tmp_path / "steps.log.gz"  # the GPG step lines without their MFU and token counts
    lines = gzip.open(GPG_LOG, "rt").read().splitlines()
    stripped = [" - ".join(p for p in line.split(" - ") if "mfu" not in p and "num_tokens" not in p) for line in lines]
    log.write_bytes(gzip.compress("\n".join(stripped).encode()))
    for command in ("validate-log", "calibrate-log"):
        line = one_line_error(sim(command, "--log", str(log), "--setup", GPG, "--out", str(tmp_path / "o")))
        assert 'gpu = "unknown" reads the device\'s peak back from perf/mfu/actor' in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["run", "compare", "plan"])
def test_an_unresolved_unknown_gpu_is_refused(tmp_path, command):
    line = one_line_error(sim(command, "--setup", GPG, "--steps", "2", "--out", str(tmp_path / "o")))
    assert 'gpu = "unknown" has no peak FLOP/s yet: calibrate it on its log first' in line
    assert not (tmp_path / "o").exists()


def test_the_spec_table_round_trips_and_runs(tmp_path):
    """The resolved device, written as [gpu_spec] over the bundled setup, loads back equal (and from a run's
    config.json), and simulates without the log."""
    resolved = resolve_gpu(load_setup(GPG), load_run_log(GPG_LOG))
    assert resolved.gpu == "unknown-311tflops" and resolved.gpu_spec.memory_bytes == pytest.approx(113.596 * 2**30)
    toml = tmp_path / "setup.toml"
    toml.write_text(setup_toml(resolved, GPG))
    assert "[gpu_spec]" in toml.read_text()
    assert load_setup(str(toml)) == resolved
    assert setup_from_dict(to_dict(resolved), "config.json") == resolved
    res = sim("run", "--setup", str(toml), "--policy", "sync", "--steps", "2", "--out", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "run" / "summary.json").exists()


@pytest.mark.parametrize(
    "table, message",
    [
        (f"{FIGURES}\nmemory_bytes = 8e10", "missing link_bytes_per_s"),
        (f"{FIGURES}\nmemory_bytes = 8e10\nlink_bytes_per_s = 4e11\ncolour = 1", "unknown key.s. colour"),
        (f"{FIGURES.replace('5e14', '0')}\nmemory_bytes = 8e10\nlink_bytes_per_s = 4e11", "peak_flops .* > 0"),
    ],
)
def test_a_spec_table_names_any_gpu_and_checks_its_keys(tmp_path, table, message):
    good = 'gpu = "my-gpu"\n[gpu_spec]\nname = "my-gpu"\nhbm_bytes_per_s = 3e12\npeak_flops = 5e14\n'
    good += "memory_bytes = 8e10\nlink_bytes_per_s = 4e11\n"
    (tmp_path / "good.toml").write_text(f'base = "{GPG}"\n{good}')
    setup = load_setup(str(tmp_path / "good.toml"))
    assert isinstance(setup.gpu_spec, GpuSpec) and setup.costs()["actor"].base.gpu.peak_flops == 5e14
    assert setup.cost == "fitted" and setup.costs()["actor"].base.efficiency == Efficiency()  # no profile named
    (tmp_path / "bad.toml").write_text(f'base = "{GPG}"\ngpu = "my-gpu"\n[gpu_spec]\nname = "my-gpu"\n{table}\n')
    with pytest.raises(ValueError, match=message):
        load_setup(str(tmp_path / "bad.toml"))


def test_a_pcie_class_box_has_its_link_read_back_from_the_constant_of_its_forward_passes():
    """The GPG run's ``old_log_prob`` takes ~20 s a step whatever its tokens: 40 micro-batches a GPU, each
    gathering 7/8 of the bf16 weights, at ~27 GB/s (its fitted 60% of steps; 35 GB/s from all of them), under a
    quarter of the A100 prior's NVLink: the device's link is read back from the log, and its source says so."""
    log = load_run_log(GPG_LOG)
    fitted = resolve_gpu(load_setup(GPG), log, 0.6).gpu_spec
    assert 20e9 < fitted.link_bytes_per_s < 30e9 and "link_bytes_per_s read back" in fitted.source
    assert 30e9 < resolve_gpu(load_setup(GPG), log).gpu_spec.link_bytes_per_s < 40e9  # from every step


def gpg_steps_with_constants(forward_s: float, update_s: float) -> list:
    """The GPG run's steps with ``old_log_prob`` and ``update_actor`` exactly a constant plus a time per token."""
    return [
        dataclasses.replace(
            s,
            stages=s.stages
            | {"old_log_prob": forward_s + 1e-5 * s.total_tokens, "update_actor": update_s + 4e-5 * s.total_tokens},
        )
        for s in load_run_log(GPG_LOG).steps
    ]


def gathers_s(link: float) -> float:
    """The seconds a step of the GPG setup's forward passes gathers its parameters at ``link``: 40 micro-batches a
    GPU, each receiving 7/8 of the bf16 weights."""
    from oppo.sim.cost.engine import model_shape

    return model_shape(load_setup(GPG).actor).weight_bytes * 7 / 8 * 40 / link


@pytest.mark.parametrize("link, read", [(50e9, True), (100e9, False)])
def test_a_link_is_read_back_only_where_the_constant_is_far_beyond_the_priors_gathers(link, read):
    """Steps whose passes are exactly a constant (the gathers at ``link``: the updates gather twice and
    reduce-scatter in fp32, four times the forward's bytes over as many micro-batches) plus a time per token: a link
    under a quarter of the prior's (the A100's 300 GB/s) is read back to 1e-6; within it the prior stands."""
    from oppo.sim.logs.device import read_back_link

    forward = gathers_s(link)
    found = read_back_link(load_setup(GPG), gpg_steps_with_constants(forward, 4 * forward), 300e9)
    assert (found == pytest.approx(link, rel=1e-6)) if read else found is None


def test_a_constant_a_step_that_is_no_gathers_is_not_read_as_a_link():
    """A constant a step alike in the forward passes and the updates (the host's or the dispatch's, not gathers,
    which the updates move four times) is no link, however large; a run on two nodes (the network's figure, not the
    link's) reads none either."""
    from oppo.sim.logs.device import read_back_link

    setup = load_setup(GPG)
    assert read_back_link(setup, gpg_steps_with_constants(20.0, 20.0), 300e9) is None
    steps = gpg_steps_with_constants(gathers_s(30e9), 4 * gathers_s(30e9))
    assert read_back_link(setup, steps, 300e9) == pytest.approx(30e9, rel=1e-6)
    across = dataclasses.replace(setup, cluster=dataclasses.replace(setup.cluster, gpus_per_node=4))
    assert read_back_link(across, steps, 300e9) is None
    # three epochs: the updates would gather 12 times the forward passes' bytes, not the constants' 4
    assert read_back_link(dataclasses.replace(setup, ppo_epochs=3), steps, 300e9) is None


def test_runs_whose_forward_passes_show_no_slow_link_keep_the_prior():
    """The MI300X run's ``old_log_prob`` line has no positive constant, the Gemma run times no ``old_log_prob``
    and the Qwen run's actor has one GPU (no gathers): none reads a link back, nor do steps whose tokens barely vary
    (no constant to read)."""
    from oppo.sim.logs.device import read_back_link

    runs = {
        "verl-deepseek-llm-7b-ppo-8xmi300x": MI300X_CSV,
        "verl-gemma-2-2b-gsm8k": DATA / "verl_gemma_2_2b.log.gz",
        "verl-qwen2.5-0.5b-gsm8k": DATA / "verl_qwen2.5_0.5b_resp512.log.gz",
    }
    for name, path in runs.items():
        assert read_back_link(load_setup(name), list(load_run_log(path).steps), 1e15) is None, name
    steady = [dataclasses.replace(s, total_tokens=2e6) for s in load_run_log(GPG_LOG).steps]
    assert read_back_link(load_setup(GPG), steady, 1e15) is None


def test_a_read_back_device_says_it_is_verls_table_and_names_a_memory_contradiction():
    """The peak read back is the one verl's table gives the device's name, which the note says; the GPG run reserved
    more memory than the A100 whose peak verl assumed, and the note names the contradiction."""
    source = resolve_gpu(load_setup(GPG), load_run_log(GPG_LOG)).gpu_spec.source
    assert "the peak verl's own table gives the device's name, which its MFU divides by" in source
    assert "a contradiction: the log reserved" in source and "more than the a100's 80 GB" in source
