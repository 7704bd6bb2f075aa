"""The rollout engine's version as each log shows it (vLLM's scheduler, CUDA graphs or eager, chunked prefill, the
tokens an iteration computes, sleep or re-init), "unknown" where a log does not say; the prompts' prefill priced by
the engine's iterations; and a prediction for an engine configuration no calibration run used: widened by the run
that used another, or no bound where none did."""

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from oppo.catalog.gpus import GPUS
from oppo.sim.cost.engine import ENGINES, MODELS, RooflineCost
from oppo.sim.cost.gpu import Efficiency
from oppo.sim.logs.interval import interval, trust_note
from oppo.sim.logs.setup_from_log import setup_from_log
from oppo.sim.logs.trust import calibration, engine_record
from oppo.sim.setup.toml_file import load_setup

DATA = Path(__file__).with_name("data")
AXES = (
    "engine (scheduler)",
    "engine (CUDA graphs)",
    "engine (chunked prefill)",
    "engine (max_num_batched_tokens)",
    "rollout kv_cache_reset",
)
# what each run's log shows (docs/simulator.md, "The rollout engine's version"), in AXES order
SHOWN = {
    "verl-qwen2.5-0.5b-gsm8k": ("v0", "eager", "unknown", "8192", "reinit"),  # printed config, dated 2024-12-10
    "verl-qwen2.5-0.5b-gsm8k-cap256": ("v0", "eager", "unknown", "8192", "reinit"),
    "verl-gemma-2-2b-gsm8k": ("v0", "eager", "unknown", "8192", "reinit"),
    "verl-deepseek-llm-7b-ppo-8xmi300x": ("unknown",) * 5,  # its launch command and step lines only
    "verl-qwen2-7b-gpg-8gpu": ("v1", "eager", "on", "8192", "sleep"),  # vllm.v1.worker in its output
    "verl-qwen2-7b-grpo-megatron-16gpu": ("unknown",) * 5,  # its launch command only
}


@pytest.mark.parametrize("name", SHOWN)
def test_each_bundled_run_records_its_engine_as_its_log_shows_it(name):
    assert tuple(engine_record(load_setup(name)).values()) == SHOWN[name]


@pytest.mark.parametrize(
    ("log", "name"),
    [
        ("verl_qwen2.5_0.5b_resp512.log.gz", "verl-qwen2.5-0.5b-gsm8k"),
        ("verl_gemma_2_2b.log.gz", "verl-gemma-2-2b-gsm8k"),
        ("verl_qwen2_7b_gpg.log.gz", "verl-qwen2-7b-gpg-8gpu"),
        ("verl_qwen2_7b_grpo_megatron_excerpt.log.gz", "verl-qwen2-7b-grpo-megatron-16gpu"),
    ],
)
def test_setup_from_log_reads_the_engine_the_log_shows_and_marks_the_rest_unknown(log, name):
    """The V1 engine by its modules in the output, V0 by a date before vLLM had V1, the rest from the printed
    configuration; a key the log states nowhere (the Megatron excerpt's command alone) is unknown, and its priced
    value (eager, sleep mode) is named in ``engine_unstated``."""
    read = setup_from_log(DATA / log, gpu="h100", model="gemma-2-2b" if "gemma" in log else None).setup()
    assert tuple(engine_record(read).values()) == SHOWN[name]
    assert read.framework.engine_unstated == load_setup(name).framework.engine_unstated


def _roofline(tp: int, cap: int) -> RooflineCost:
    model, gpu = MODELS["qwen2-7b"], GPUS["h100"]
    eff = Efficiency(bandwidth_frac=0.9, flops_frac=0.6, layer_overhead_s=70e-6)
    return RooflineCost(model, gpu, 8, ENGINES["vllm"], eff, tensor_parallel=tp, max_batched_tokens=cap)


def test_a_prefill_takes_an_engine_iteration_per_max_num_batched_tokens_of_each_engines_prompts():
    """1,024 prompts of 100 tokens on 8 H100, vLLM tensor parallel 2: four engines, 25,600 tokens each, 8,192 an
    iteration: 4 iterations, each reading the weights (15.2 GB at 0.9 x 3.35 TB/s: 5 ms) and launching the 28 layers'
    kernels (70 us each: 2 ms) once; the compute (2 x 7.6e9 FLOPs a token, 1e5 tokens a GPU... at 0.6 x 989 TFLOP/s)
    is the same tokens either way. Without a cap (0), one pass, as before."""
    tokens, attended = 1024 * 100.0, 1024 * 100 * 50.0
    one, capped = _roofline(2, 0), _roofline(2, 8192)
    assert one.prefill_iterations(tokens) == 1 and capped.prefill_iterations(tokens) == 4
    model = MODELS["qwen2-7b"]
    weights_s = model.weight_bytes / (0.9 * GPUS["h100"].hbm_bytes_per_s)  # seconds, a GPU reading the weights once
    compute_s = model.forward_flops(tokens / 8, attended / 8) / (0.6 * GPUS["h100"].peak_flops)
    launch_s = model.layers * 70e-6
    assert one.prefill_s(tokens, attended) == pytest.approx(max(weights_s, compute_s) + launch_s, rel=1e-12)
    assert capped.prefill_s(tokens, attended) == pytest.approx(max(4 * weights_s, compute_s) + 4 * launch_s, rel=1e-12)
    # a cap over each engine's tokens is one iteration; tensor parallel 4 halves the engines, doubling their share
    assert _roofline(2, 25_600).prefill_iterations(tokens) == 1
    assert _roofline(4, 8192).prefill_iterations(tokens) == math.ceil(51_200 / 8192)


def test_the_bundled_runs_that_state_a_token_budget_price_their_prefill_by_it():
    """The setup hands the roofline its ``max_num_batched_tokens``; one that does not state it prices one pass."""
    gpg = load_setup("verl-qwen2-7b-gpg-8gpu")
    gpg = dataclasses.replace(gpg, gpu="a100")  # a named GPU: the unknown one needs its log
    assert gpg.costs("sync")["actor"].base.max_batched_tokens == 8192
    assert load_setup("verl-deepseek-llm-7b-ppo-8xmi300x").costs("sync")["actor"].base.max_batched_tokens == 0


def _with(setup, **framework):
    return dataclasses.replace(setup, framework=dataclasses.replace(setup.framework, **framework))


def _record(names, errors):
    """A calibration of the named bundled setups whose runs missed each step by ``errors`` (one per run)."""
    setups = [load_setup(n) for n in names]
    steps = {"step": [np.full(10, e) for e in errors]}
    return calibration(setups, steps, basis="leave_one_group_out", groups=list(range(len(setups))))


def test_an_engine_setting_no_calibration_run_used_has_no_bound_and_one_another_run_used_widens_by_its_error():
    """The five shared runs, their median step errors made up (3-12%, the GPG run's 12%). Every log that states it
    ran eager: a prediction with CUDA graphs extrapolates on an engine setting no run differs on, and prints no bound.
    The GPG run is the one V1 engine (chunked prefill on): the others lay outside it on neither, but it lay outside
    them, so a V1 engine is inside, and chunked prefill off, which no run stated, widens the interval to the GPG
    run's 12%. The MI300X run states nothing of its engine: its unknowns widen nothing."""
    names = [
        "verl-qwen2.5-0.5b-gsm8k",
        "verl-qwen2.5-0.5b-gsm8k-cap256",
        "verl-gemma-2-2b-gsm8k",
        "verl-deepseek-llm-7b-ppo-8xmi300x",
        "verl-qwen2-7b-gpg-8gpu",
    ]
    record = _record(names, [0.05, 0.03, 0.08, 0.30, 0.12])
    widened = dict(zip(record.axes, record.axis_err))
    assert widened["engine (scheduler)"] == widened["engine (chunked prefill)"] == 0.12
    assert "engine (CUDA graphs)" not in widened and "engine (max_num_batched_tokens)" not in widened
    assert record.engine_cuda_graphs == ("eager", "unknown") and record.engine_schedulers == ("unknown", "v0", "v1")
    gemma = _with(load_setup("verl-gemma-2-2b-gsm8k"), calibration=record)
    assert interval(gemma).step == record.step_err and interval(gemma).extrapolates == ()
    graphs = interval(_with(gemma, decode_cuda_graphs=True))
    assert graphs.step is None and graphs.unbounded == ("engine (CUDA graphs)",)
    note = trust_note(_with(gemma, decode_cuda_graphs=True))
    assert "no bound: extrapolates on engine (CUDA graphs)" in note
    assert "engine (CUDA graphs) 'CUDA graphs' (calibrated on 'eager', 'unknown')" in note
    assert interval(_with(gemma, rollout_scheduler="v1")).extrapolates == ()
    off = interval(_with(gemma, chunked_prefill="off"))
    assert off.extrapolates == ("engine (chunked prefill)",) and off.step == max(record.step_err, 0.12)
    budget = interval(_with(gemma, max_num_batched_tokens=2048))
    assert budget.step is None and budget.unbounded == ("engine (max_num_batched_tokens)",)


def test_without_the_v1_run_a_v1_engine_has_no_bound_and_an_unstated_engine_is_inside_only_beside_one():
    """Calibrated on the V0 runs and the MI300X run (which states nothing of its engine): a V1 engine, which no run
    is known to have used, has no bound; a setup that states nothing either is inside (the MI300X run was as
    unknown); calibrated on the V0 runs alone, the unknown is named."""
    record = _record(
        ["verl-qwen2.5-0.5b-gsm8k", "verl-gemma-2-2b-gsm8k", "verl-deepseek-llm-7b-ppo-8xmi300x"], [0.05] * 3
    )
    gemma = _with(load_setup("verl-gemma-2-2b-gsm8k"), calibration=record)
    assert interval(_with(gemma, rollout_scheduler="v1")).unbounded == ("engine (scheduler)",)
    assert interval(_with(gemma, rollout_scheduler="unknown")).extrapolates == ()
    v0_only = _with(gemma, calibration=_record(["verl-qwen2.5-0.5b-gsm8k", "verl-gemma-2-2b-gsm8k"], [0.05] * 2))
    assert interval(_with(v0_only, rollout_scheduler="unknown")).unbounded == ("engine (scheduler)",)
    assert "engine (scheduler) 'unknown' (calibrated on 'v0')" in trust_note(
        _with(v0_only, rollout_scheduler="unknown")
    )


@pytest.mark.parametrize(
    ("line", "date", "scheduler", "reset"),
    [
        (
            "INFO 05-02 10:00:01 llm_engine.py:234] Initializing a V1 LLM engine (v0.8.5) with config: ...",
            None,
            "v1",
            "sleep",
        ),
        ("INFO vLLM version 0.6.3", None, "v0", "reinit"),  # printed, before V1 existed
        ("(WorkerDict pid=1) INFO: started", "2025-01-20 09:00:00", "v0", "reinit"),  # dated before vLLM 0.7.0
        ("(WorkerDict pid=1) INFO: started", "2025-03-01 09:00:00", "unknown", "reinit"),  # V1 opt-in then: unknown
    ],
)
def test_the_engine_generation_is_read_from_what_the_log_prints(tmp_path, line, date, scheduler, reset):
    """A V1 engine's start-up line or modules say V1; a vLLM older than 0.7 or a date before it say V0; otherwise
    the scheduler is unknown. free_cache_engine stated: sleep mode with a V1 engine, else by version or date."""
    log = tmp_path / "run.log"
    stamp = f"{date},000 INFO worker.py:1 -- started\n" if date else ""
    log.write_text(
        stamp + "+ python3 -m verl.trainer.main_ppo data.train_batch_size=32 data.max_response_length=128 "
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct trainer.n_gpus_per_node=1 "
        f"actor_rollout_ref.rollout.free_cache_engine=True actor_rollout_ref.rollout.enforce_eager=True\n{line}\n"
        "step:1 - timing_s/gen:1.0 - response_length/mean:100.0 - response_length/max:128.0 - prompt_length/mean:50\n"
    )
    setup = setup_from_log(log, gpu="h100").setup()
    assert setup.framework.rollout_scheduler == scheduler
    assert setup.framework.kv_cache_reset == reset and setup.framework.engine_unstated == ()


@pytest.mark.parametrize(
    ("date", "graphs"), [("2025-09-01 09:00:00", True), ("2025-06-01 09:00:00", False), (None, False)]
)
def test_an_unstated_enforce_eager_is_verls_default_of_the_logs_date_and_unknown(tmp_path, date, graphs):
    """verl's rollout decodes with CUDA graphs by default since August 2025 (its PR #2956), eagerly before: a log
    that does not state enforce_eager is priced with its date's default (undated: eager, as before), and the key is
    named unstated (an unknown in a calibration's span)."""
    log = tmp_path / "run.log"
    stamp = f"{date},000 INFO worker.py:1 -- started\n" if date else ""
    log.write_text(
        stamp + "+ python3 -m verl.trainer.main_ppo data.train_batch_size=32 data.max_response_length=128 "
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct trainer.n_gpus_per_node=1\n"
        "step:1 - timing_s/gen:1.0 - response_length/mean:100.0 - response_length/max:128.0 - prompt_length/mean:50\n"
    )
    setup = setup_from_log(log, gpu="h100").setup()
    assert setup.framework.decode_cuda_graphs is graphs
    assert "decode_cuda_graphs" in setup.framework.engine_unstated
    assert engine_record(setup)["engine (CUDA graphs)"] == "unknown"
