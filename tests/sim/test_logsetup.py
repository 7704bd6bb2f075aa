"""A verl run's setup read from its console log (``setup-from-log``), and the log commands that take a log without
``--setup``: on the shared real logs, the setup equals the bundled hand-written one key by key (each difference
named with its reason); bad logs are one line and exit 2."""

import dataclasses
import gzip
from pathlib import Path

import numpy as np
import pytest

from oppo.sim.logs.read import load_run_log
from oppo.sim.logs.setup_from_log import model_name, setup_from_log
from oppo.sim.logs.verl_config import contradictions, parse_value, read_verl_config
from oppo.sim.setup.toml_file import load_setup
from tests import invoke

DATA = Path(__file__).with_name("data")
# each shared console log, its bundled setup, the options the log cannot give (the GPU is never printed; the Gemma
# actor is a local SFT checkpoint), and the fields that differ, with the reason
LENGTHS = ("lengths.median_tokens", "lengths.sigma", "lengths.prompt_tokens")  # the bundled ones were set by hand
SHARED = [
    (
        "verl_qwen2.5_0.5b_resp512.log.gz",
        "verl-qwen2.5-0.5b-gsm8k",
        ("--gpu", "h100"),
        # the bundled lengths are the paper preset's responses: the replay draws each step's own anyway
        {"name", "cluster.gpus_per_node", *LENGTHS},
    ),
    (
        "verl_qwen2.5_0.5b_resp256.log.gz",
        "verl-qwen2.5-0.5b-gsm8k-cap256",
        ("--gpu", "h100"),
        {"name", "cluster.gpus_per_node", *LENGTHS},
    ),
    (
        "verl_gemma_2_2b.log.gz",
        "verl-gemma-2-2b-gsm8k",
        ("--gpu", "h100", "--model-config", "gemma-2-2b"),
        {"name", "cluster.gpus_per_node", *LENGTHS},
    ),
    # the bundled GPG setup offloads the reference, which GPG does not run (no effect); its lengths are the log's
    ("verl_qwen2_7b_gpg.log.gz", "verl-qwen2-7b-gpg-8gpu", (), {"name", "framework.offload"}),
    # its Megatron twin: enable_gradient_checkpointing=True, yet Megatron recomputes nothing (the granularity None)
    ("verl_qwen2_7b_gpg_megatron.log.gz", "verl-qwen2-7b-gpg-megatron-8gpu", (), {"name"}),
]


def differing_fields(a, b, prefix: str = "") -> set[str]:
    """Dotted names of the fields whose values differ between two dataclasses of one type."""
    out = set()
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if dataclasses.is_dataclass(x) and dataclasses.is_dataclass(y):
            out |= differing_fields(x, y, f"{prefix}{f.name}.")
        elif x != y:
            out.add(prefix + f.name)
    return out


def options(args: tuple[str, ...]) -> dict:
    pairs = dict(zip(args[::2], args[1::2]))
    return {"gpu": pairs.get("--gpu"), "model": pairs.get("--model-config")}


@pytest.mark.parametrize(("log", "bundled", "args", "differ"), SHARED, ids=[s[1] for s in SHARED])
def test_each_shared_console_log_reads_to_its_bundled_setup_key_by_key(log, bundled, args, differ):
    found = setup_from_log(DATA / log, **options(args)).setup()
    assert differing_fields(found, load_setup(bundled)) == differ


def test_the_printed_configuration_wins_and_the_command_fills_a_printout_cut_short():
    """The Gemma log's printout is cut by another process's output inside ``trainer``: what follows the cut
    (``n_gpus_per_node``) comes from the launch command, the rest from the printout (the model path the command
    also sets, to a hub id first and to the local checkpoint last, is the printout's)."""
    config = read_verl_config(DATA / "verl_gemma_2_2b.log.gz")
    assert config.printed and config.truncated and config.date == "2024-12-17"
    assert config.get("trainer.n_gpus_per_node") == 2 and config.origin["trainer.n_gpus_per_node"] == "command"
    assert config.get("actor_rollout_ref.model.path") == "sft_model_path/global_step_58"
    assert config.origin["actor_rollout_ref.model.path"] == "config"
    assert config.get("actor_rollout_ref.rollout.tensor_model_parallel_size") == 2
    whole = read_verl_config(DATA / "verl_qwen2.5_0.5b_resp512.log.gz")
    assert whole.printed and not whole.truncated and set(whole.origin.values()) == {"config"}


def test_a_log_with_only_its_launch_command_reads_the_command():
    config = read_verl_config(DATA / "verl_qwen2_7b_grpo_megatron_excerpt.log.gz")
    assert (
        not config.printed
        and config.entry == "verl.trainer.main_ppo"
        and config.config_name == "ppo_megatron_trainer.yaml"
    )
    assert config.get("actor_rollout_ref.actor.megatron.tensor_model_parallel_size") == 4
    assert config.get("data.train_files") == [
        "/home/tiger/data/gsm8k/train.parquet",
        "/home/tiger/data/math/train.parquet",
    ]
    assert config.get("trainer.logger") == ["console", "wandb"]


def test_hydra_values_and_prefixes(tmp_path):
    assert [parse_value(v) for v in ("True", "false", "null", "1e-6", "16", "[a,b]", "fsdp")] == [
        True, False, None, 1e-6, 16, ["a", "b"], "fsdp",
    ]  # fmt: skip
    log = tmp_path / "run.log"
    log.write_text(
        "+ python3 -m verl.trainer.main_ppo +trainer.n_gpus_per_node=4 ++data.train_batch_size=64 "
        "data.train_batch_size=32 --config-name=ppo_trainer\n"
    )
    config = read_verl_config(log)
    assert config.get("trainer.n_gpus_per_node") == 4 and config.get("data.train_batch_size") == 32  # the last wins
    assert config.config_name == "ppo_trainer"


def test_the_gemma_logs_own_words_give_its_rollout_and_micro_batches():
    """What the bundled Gemma setup had wrong before it was read from its log, read off the log's own text: the
    rollout over both GPUs, and micro-batches of 4 that verl of that commit (d60f843, ``fsdp_workers.py``:
    ``ppo_micro_batch_size //= self.device_mesh.shape[0]``) divides by the 2 GPUs."""
    text = gzip.decompress((DATA / "verl_gemma_2_2b.log.gz").read_bytes()).decode()
    assert "rollout.tensor_model_parallel_size=2" in text and "actor.ppo_micro_batch_size=4" in text
    assert "trainer.n_gpus_per_node=2" in text and "log_prob_micro_batch_size=4" in text
    fw = setup_from_log(DATA / "verl_gemma_2_2b.log.gz", gpu="h100", model="gemma-2-2b").setup().framework
    assert (fw.rollout_tensor_parallel, fw.train_micro_batch, fw.forward_micro_batch) == (2, 4 // 2, 4 // 2)


def test_dynamic_batches_hold_as_many_mean_sequences_as_the_token_budget(tmp_path):
    """``use_dynamic_bsz``: verl packs micro-batches up to ``ppo_max_token_len_per_gpu`` tokens (16,384 here), so a
    micro-batch holds that over a mean sequence (the log's median prompt + response means)."""
    log = DATA / "verl_qwen2_7b_gpg.log.gz"
    text = gzip.decompress(log.read_bytes()).decode().replace("'use_dynamic_bsz': False", "'use_dynamic_bsz': True")
    path = tmp_path / "dyn.log"
    path.write_text(text)
    steps = load_run_log(log).steps
    mean = np.median([s.prompt_mean for s in steps]) + np.median([s.response_mean for s in steps])
    assert setup_from_log(path).setup().framework.train_micro_batch == int(16384 // mean)


def test_catalog_names_from_model_paths():
    assert model_name("Qwen/Qwen2.5-0.5B-Instruct") == "qwen2.5-0.5b"
    assert model_name("/cache/hub/models--Qwen--Qwen2-7B-Instruct/snapshots/f2826a00") == "qwen2-7b"
    assert model_name("~/models/deepseek-llm-7b-chat") == "deepseek-llm-7b"
    assert model_name("google/gemma-2-2b-it") == "gemma-2-2b"
    assert model_name("sft_model_path/global_step_58") is None


def test_setup_from_log_writes_a_setup_that_loads_as_read(tmp_path):
    out = tmp_path / "setup.toml"
    res = invoke.sim("setup-from-log", DATA / "verl_qwen2_7b_gpg.log.gz", "--out", out)
    assert res.returncode == 0, res.stderr
    assert load_setup(str(out)) == setup_from_log(DATA / "verl_qwen2_7b_gpg.log.gz").setup()
    assert "rollout.tensor_model_parallel_size" in res.stdout  # each key used, with its verl key
    assert "ignored actor_rollout_ref.rollout.max_num_seqs=1024: " in res.stdout  # and each left aside
    assert 'kv_cache_reset = "sleep"' in out.read_text()  # a V1 engine: vLLM's sleep mode


def test_calibrate_log_without_a_setup_reads_it_from_the_log_and_agrees_with_the_bundled_one(tmp_path):
    log = DATA / "verl_qwen2.5_0.5b_resp256.log.gz"
    own = invoke.sim("calibrate-log", "--log", log, "--gpu", "h100", "--out", tmp_path / "own")
    bundled = invoke.sim(
        "calibrate-log", "--log", log, "--setup", "verl-qwen2.5-0.5b-gsm8k-cap256", "--out", tmp_path / "b"
    )
    assert own.returncode == 0, own.stderr
    assert bundled.returncode == 0, bundled.stderr
    import json

    a, b = (json.loads((tmp_path / d / "fidelity.json").read_text()) for d in ("own", "b"))
    assert a["step"]["median_abs_err"] == pytest.approx(b["step"]["median_abs_err"], rel=1e-9)
    assert (
        load_setup(str(tmp_path / "own" / "setup.toml")).framework.gen
        == load_setup(str(tmp_path / "b" / "setup.toml")).framework.gen
    )
    assert (tmp_path / "own" / "log_setup.toml").is_file()


def test_a_setup_that_contradicts_the_logs_configuration_is_refused(tmp_path):
    assert contradictions(load_setup("verl-qwen2.5-0.5b-gsm8k"), DATA / "verl_qwen2.5_0.5b_resp512.log.gz") == ""
    clash = contradictions(load_setup("verl-qwen2.5-0.5b-gsm8k-cap256"), DATA / "verl_qwen2.5_0.5b_resp512.log.gz")
    assert clash == "its max_new_tokens is 256, the log's data.max_response_length is 512"
    toml = tmp_path / "tp.toml"
    toml.write_text('base = "verl-qwen2-7b-gpg-8gpu"\n[framework]\nrollout_tensor_parallel = 4\n')
    res = invoke.sim(
        "validate-log", "--log", DATA / "verl_qwen2_7b_gpg.log.gz", "--setup", toml, "--out", tmp_path / "o"
    )
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert (
        "rollout_tensor_parallel is 4, the log's actor_rollout_ref.rollout.tensor_model_parallel_size is 2"
        in res.stderr
    )
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("framework", "clash"),
    [
        ("decode_cuda_graphs = true", "its decode_cuda_graphs (as enforce_eager) is False, the log's"),
        ('chunked_prefill = "off"', "its chunked_prefill (as enable_chunked_prefill) is False, the log's"),
        ("max_num_batched_tokens = 4096", "its max_num_batched_tokens is 4096, the log's"),
        ('rollout_scheduler = "v0"', "its rollout_scheduler is 'v0', the log shows a vLLM V1 engine at work"),
    ],
)
def test_a_setup_whose_rollout_engine_contradicts_the_log_is_refused(framework, clash):
    """The engine's version the log shows (eager, chunked prefill on, 8,192 tokens an iteration, a V1 engine) and a
    setup stating another: refused by name; a setup that leaves it unstated is not."""
    gpg = load_setup("verl-qwen2-7b-gpg-8gpu")
    key, value = (part.strip() for part in framework.split("="))
    value = {"true": True}.get(value, int(value) if value.isdigit() else value.strip('"'))
    changed = dataclasses.replace(gpg, framework=dataclasses.replace(gpg.framework, **{key: value}))
    assert contradictions(changed, DATA / "verl_qwen2_7b_gpg.log.gz").startswith(clash)
    unstated = dataclasses.replace(
        gpg.framework, rollout_scheduler="unknown", chunked_prefill="unknown", max_num_batched_tokens=0
    )
    unstated = dataclasses.replace(unstated, decode_cuda_graphs=True, engine_unstated=("decode_cuda_graphs",))
    assert contradictions(dataclasses.replace(gpg, framework=unstated), DATA / "verl_qwen2_7b_gpg.log.gz") == ""


def edited_log(tmp_path: Path, old: str, new: str) -> Path:
    text = gzip.decompress((DATA / "verl_qwen2_7b_gpg.log.gz").read_bytes()).decode()
    assert old in text
    path = tmp_path / "run.log"
    path.write_text(text.replace(old, new))
    return path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (None, "no verl launch command or printed configuration"),
        (("'train_batch_size': 1024,", "'val_batch_size_': 1024,"), "lacks data.train_batch_size"),
        (("'adv_estimator': 'gpg'", "'adv_estimator': 'magic'"), "unknown adv_estimator 'magic'"),
        (
            ("models--Qwen--Qwen2-7B-Instruct", "models--Acme--Secret-9B"),
            "is no model the catalog knows; pass --model-config",
        ),
        (("'name': 'vllm',", "'name': 'tgi',"), "unknown rollout engine 'tgi'"),
        (("'n': 5,", "'n': '${N}',"), "rollout.n='${N}' is not a number"),
        (("'strategy': 'fsdp',", "'strategy': 'deepspeed',"), "unknown training strategy 'deepspeed'"),
    ],
)
def test_bad_logs_are_one_line_and_exit_2(tmp_path, edit, message):
    if edit is None:
        log = DATA / "verl_deepseek_7b_ppo_8xmi300x.csv.gz"
    else:
        log = edited_log(tmp_path, *edit)
        log.write_text(log.read_text().replace("data.train_batch_size=1024 ", ""))  # the command must not say it
    res = invoke.sim("setup-from-log", log, "--out", tmp_path / "s.toml")
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and message in res.stderr
    assert not (tmp_path / "s.toml").exists()


def test_a_reference_after_verls_forced_cpu_offload_copies_in_at_every_micro_batch(tmp_path):
    """verl PR #121 (2025-01-24) wraps the reference in FSDP's CPU offload whatever ``ref.param_offload`` says: a
    log dated after it reads ``offload_each_micro_batch = ["reference"]``, the reference offloaded, even with the
    flag off; the December 2024 log it is edited from loads the reference once a pass."""
    log = DATA / "verl_qwen2.5_0.5b_resp512.log.gz"
    before = setup_from_log(log, gpu="h100").setup().framework
    assert before.offload == ("reference",) and before.offload_each_micro_batch == ()
    text = gzip.decompress(log.read_bytes()).decode().replace("2024-12-10 06:50", "2025-03-01 06:50")
    flag = "'ref': {'fsdp_config': {'param_offload': "
    text = text.replace(flag + "True", flag + "False")
    path = tmp_path / "later.log"
    path.write_text(text)
    after = setup_from_log(path, gpu="h100").setup().framework
    assert after.offload == ("reference",) and after.offload_each_micro_batch == ("reference",)
    # a reward model (verl's PR #121 forces the offload on it too)
    text = text.replace("'reward_model': {'enable': False", "'reward_model': {'enable': True")
    text = text.replace("'path': '~/models/FsfairX-LLaMA3-RM-v0.1'", "'path': 'Qwen/Qwen2.5-0.5B-Instruct'")
    path.write_text(text)
    rm = setup_from_log(path, gpu="h100").setup().framework
    assert set(rm.offload) == set(rm.offload_each_micro_batch) == {"reference", "reward"}


def test_an_fsdp_trainers_optimizer_on_the_host_is_read_and_priced(tmp_path):
    """``fsdp_config.optimizer_offload`` on the actor and the critic: the setup keeps both trainers' Adam state on
    the host (``optimizer_offload``, priced in their updates) and no longer lists the key as not modelled."""
    log = DATA / "verl_qwen2.5_0.5b_resp512.log.gz"
    text = gzip.decompress(log.read_bytes()).decode().replace("'optimizer_offload': False", "'optimizer_offload': True")
    path = tmp_path / "offloaded.log"
    path.write_text(text)
    read = setup_from_log(path, gpu="h100")
    assert read.setup().framework.optimizer_offload == ("actor", "critic")
    assert not [key for key, _, _ in read.ignored if "optimizer_offload" in key]
    assert setup_from_log(log, gpu="h100").setup().framework.optimizer_offload == ()


def test_the_gradients_reduce_dtype_is_read_from_the_actors_mixed_precision(tmp_path):
    """verl's FSDP reduce-scatters the gradients in fp32 unless ``fsdp_config.mixed_precision.reduce_dtype`` says
    otherwise: 4 bytes a gradient by default, 2 for bf16."""
    assert setup_from_log(DATA / "verl_qwen2_7b_gpg.log.gz").setup().framework.reduce_bytes_per_param == 4
    prefix = "'fsdp_config': {'forward_prefetch': False,"
    path = edited_log(tmp_path, prefix, prefix + " 'mixed_precision': {'reduce_dtype': 'bf16'},")
    assert setup_from_log(path).setup().framework.reduce_bytes_per_param == 2


def test_hybrid_sharding_is_listed_as_not_modelled(tmp_path):
    """``fsdp_config.fsdp_size`` other than -1 (HSDP: shards within groups, replicas across them) is read as full
    sharding and said so."""
    path = edited_log(tmp_path, "'fsdp_size': -1,", "'fsdp_size': 4,")
    ignored = [why for key, _, why in setup_from_log(path).ignored if key.endswith("fsdp_config.fsdp_size")]
    assert ignored and all("HSDP" in why for why in ignored)
    default = setup_from_log(DATA / "verl_qwen2_7b_gpg.log.gz").ignored
    assert not [why for key, _, why in default if key.endswith("fsdp_config.fsdp_size") and "HSDP" in why]


def test_a_mini_batch_larger_than_the_batch_is_one_mini_batch_as_verl_of_early_2025_ran_it(tmp_path):
    """verl of early 2025 split the batch by ppo_mini_batch_size without checking it: a mini-batch larger than the
    batch trained the whole batch as one (later versions refuse it at launch). Read as it ran, not refused."""
    path = edited_log(tmp_path, "'ppo_mini_batch_size': 256,", "'ppo_mini_batch_size': 2048,")
    path.write_text(path.read_text().replace("actor.ppo_mini_batch_size=256", "actor.ppo_mini_batch_size=2048"))
    assert setup_from_log(path).setup().minibatches == 1
    assert setup_from_log(DATA / "verl_qwen2_7b_gpg.log.gz").setup().minibatches == 4  # 1024 / 256


def test_megatron_recomputes_activations_only_where_the_configuration_names_a_granularity(tmp_path):
    """verl sets Megatron's recompute_granularity from override_transformer_config, or under
    enable_gradient_checkpointing from gradient_checkpointing_kwargs (default null): the flag alone recomputes
    nothing. The GPG twin's printed configuration gives the flag True and the granularity None (its workers print
    TransformerConfig(recompute_granularity=None)); the 16-GPU excerpt's launch command gives the flag alone (verl's
    default: none); a granularity "full" in the override recomputes."""
    twin = setup_from_log(DATA / "verl_qwen2_7b_gpg_megatron.log.gz")
    assert twin.setup().framework.gradient_checkpointing is False
    used = next(u for u in twin.used if u.key == "framework.gradient_checkpointing")
    assert "activations_checkpoint_granularity" in used.verl and used.origin == "config"
    excerpt = setup_from_log(DATA / "verl_qwen2_7b_grpo_megatron_excerpt.log.gz")
    assert excerpt.setup().framework.gradient_checkpointing is False
    text = gzip.open(DATA / "verl_qwen2_7b_grpo_megatron_excerpt.log.gz", "rt").read()
    full = "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full"
    log = tmp_path / "full.log"
    log.write_text(text.replace("trainer.total_epochs=15", f"trainer.total_epochs=15 +{full}", 1))
    assert setup_from_log(log).setup().framework.gradient_checkpointing is True
