import dataclasses

import numpy as np
import pytest

from oppo.sim.cost.engine import ENGINES, MODELS, RooflineCost
from oppo.sim.cost.gpu import GPUS, Efficiency, fit_roofline, gpu_efficiencies
from oppo.sim.cost.stage import StageCost
from tests import invoke


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_recovers_known_coefficients(seed):
    rng = np.random.default_rng(seed)
    c, a, b = 3e-5, 1 / 1.5e12, 1 / 2e14  # fixed s, s/byte, s/FLOP
    bytes_read = rng.uniform(1e8, 5e8, 400)
    flops = bytes_read * rng.uniform(1, 4000, 400)
    seconds = (c + np.maximum(a * bytes_read, b * flops)) * rng.normal(1, 0.01, 400)
    fc, fa, fb = fit_roofline(bytes_read, flops, seconds)
    assert fa == pytest.approx(a, rel=0.03) and fb == pytest.approx(b, rel=0.03)
    assert fc == pytest.approx(c, abs=1e-5)


def test_profile_fits_are_physical_and_accurate():
    fits = gpu_efficiencies()
    assert {"a100", "h100", "a40", "h200", "gh200", "a100-40gb"} <= set(fits)
    for fit in fits.values():
        assert 0.3 < fit.efficiency.bandwidth_frac <= 1.0
        assert 0.3 < fit.efficiency.flops_frac <= 1.0
        assert fit.heldout_median_abs_err < 0.10


def test_a_gpu_without_a_profile_takes_a_profiled_ones_fractions_scaled_by_their_measured_matmul_ceilings():
    """MI300X has no operator profile: it takes the H100's, its FLOP/s fractions (forward and training) times the
    ratio of the two GPUs' measured matmul ceilings over their datasheets (668.4 of 1307.4 and 794.5 of 989
    TFLOP/s); its bandwidth fraction, not a matmul's, stays. The H200, whose ceiling is the H100's, and the L40S,
    whose ceiling was not measured, take their profile's fractions as they are."""
    fits = gpu_efficiencies()
    h100, mi300x = fits["h100"].efficiency, fits["mi300x"].efficiency
    ratio = (668.4 / 1307.4) / (794.5 / 989)
    assert GPUS["mi300x"].matmul_frac / GPUS["h100"].matmul_frac == pytest.approx(ratio, rel=1e-12)
    assert mi300x.flops_frac == pytest.approx(h100.flops_frac * ratio, rel=1e-12)
    assert mi300x.train_flops_frac == pytest.approx(h100.train_flops_frac * ratio, rel=1e-12)
    assert mi300x.bandwidth_frac == h100.bandwidth_frac
    assert mi300x.layer_overhead_s == h100.layer_overhead_s
    assert fits["h200"].efficiency == h100
    assert fits["l40s"].efficiency == fits["a40"].efficiency


def test_decode_is_bandwidth_bound_and_prefill_compute_bound():
    cost = RooflineCost(MODELS["qwen2.5-7b"], GPUS["h100"], 1, ENGINES["vllm"], Efficiency())
    one, many = cost.decode_s(1, 100), cost.decode_s(64, 6400)
    assert many < 2 * one  # batching decode is nearly free: weights are read once per iteration
    assert cost.prefill_s(8192, 8192 * 512) > 3 * cost.prefill_s(2048, 2048 * 512)  # compute grows with tokens
    h200 = RooflineCost(MODELS["qwen2.5-7b"], GPUS["h200"], 1, ENGINES["vllm"], Efficiency())
    assert h200.decode_s(1, 100) < one  # more bandwidth, faster decode


# -- the rollout engine's framework settings ------------------------------------------------------------------
def vllm_on(gpus: int, **engine) -> RooflineCost:
    return RooflineCost(MODELS["deepseek-llm-7b"], GPUS["mi300x"], gpus, ENGINES["vllm"], Efficiency(), **engine)


def test_tensor_parallel_splits_the_weights_and_pays_an_all_reduce_per_layer():
    model, gpu = MODELS["deepseek-llm-7b"], GPUS["mi300x"]
    batch, context = np.array([256.0]), np.array([256.0 * 300])
    dp, tp = vllm_on(8).decode_s(batch, context), vllm_on(8, tensor_parallel=4).decode_s(batch, context)
    # two engines of 4 GPUs: each reads a quarter of the weights per GPU for 128 rows instead of all of them for
    # 32; memory-bound, so per iteration: (W/4 + KV(128 rows)/4) vs (W + KV(32 rows)), plus the all-reduces
    bandwidth = gpu.hbm_bytes_per_s * Efficiency().bandwidth_frac * ENGINES["vllm"].decode_efficiency
    kv = model.kv_bytes_per_token * context[0] / 8  # per GPU in both layouts
    moved = 2 * 3 / 4 * 128 * model.hidden * model.bytes_per_param
    allreduce = 2 * model.layers * (10e-6 + moved / gpu.link_bytes_per_s)
    expected_gain = (model.weight_bytes + kv) / bandwidth - (model.weight_bytes / 4 + kv) / bandwidth - allreduce
    assert dp[0] - tp[0] == pytest.approx(expected_gain, rel=1e-9)
    with pytest.raises(ValueError, match="rollout tensor parallel 3 does not divide the 8 generating GPUs"):
        vllm_on(8, tensor_parallel=3)


def test_a_batch_beyond_the_kv_budget_decodes_as_resident_batches_that_fill_it():
    """Continuous batching: rows whose KV does not fit wait and take a finished row's slot, so an iteration over
    every row costs their KV over the budget resident batches (2.5 here, no whole waves: 3 would charge the weights
    and fixed costs for half a batch that is not there), each reading the weights once."""
    model = MODELS["deepseek-llm-7b"]
    batch, context = np.array([512.0, 512.0]), np.array([512.0 * 100, 512.0 * 1000])
    kv_per_gpu = model.kv_bytes_per_token * context / 8
    budget = kv_per_gpu[1] / 2.5  # the short contexts fit, the long ones take 2.5 budgets
    free, tight = vllm_on(8).decode_s(batch, context), vllm_on(8, kv_budget_bytes=budget).decode_s(batch, context)
    assert tight[0] == free[0]
    bandwidth = GPUS["mi300x"].hbm_bytes_per_s * Efficiency().bandwidth_frac * ENGINES["vllm"].decode_efficiency
    # the same rows and KV in 2.5 resident batches: the weights read 1.5 times more, the fixed per-iteration costs
    # paid 2.5 times
    fixed = ENGINES["vllm"].decode_step_overhead_s + model.layers * Efficiency().layer_overhead_s
    assert tight[1] - free[1] == pytest.approx(1.5 * (model.weight_bytes / bandwidth + fixed), rel=1e-9)


def test_cuda_graphs_launch_an_iteration_once_instead_of_per_layer():
    batch, context = np.array([64.0]), np.array([64.0 * 500])
    eager, graphs = vllm_on(8).decode_s(batch, context), vllm_on(8, eager_decode=False).decode_s(batch, context)
    layers = MODELS["deepseek-llm-7b"].layers
    assert eager[0] - graphs[0] == pytest.approx((layers - 1) * Efficiency().layer_overhead_s, rel=1e-9)


def test_padding_and_the_critics_own_micro_batch():
    from oppo.sim.cost.framework import Framework

    lengths = np.array([100, 300, 200])
    assert Framework().pass_tokens(lengths) == 600  # packed: real tokens
    assert Framework(packed=False).pass_tokens(lengths) == 900  # every row padded to the longest
    fw = Framework(train_micro_batch=16, critic_train_micro_batch=32)
    assert (fw.train_micro_batch_of("actor"), fw.train_micro_batch_of("critic")) == (16, 32)
    assert Framework(train_micro_batch=16).train_micro_batch_of("critic") == 16
    fw = Framework(forward_micro_batch=4, critic_forward_micro_batch=2)
    assert (fw.forward_micro_batch_of("reference"), fw.forward_micro_batch_of("critic")) == (4, 2)
    assert Framework(forward_micro_batch=4).forward_micro_batch_of("critic") == 4


def test_the_critics_values_pass_pays_its_own_micro_batches():
    """verl's critic scores in micro-batches of its own (critic.forward_micro_batch_size): with a host time per
    micro-batch, halving them adds exactly that time once per micro-batch more (8 sequences on one GPU: 4 -> 2 a
    micro-batch, 2 -> 4 micro-batches)."""
    from oppo.sim.cost.framework import Framework, FrameworkCost
    from oppo.sim.cost.stage import StageCost

    base = RooflineCost(MODELS["qwen2.5-0.5b"], GPUS["h100"], 1, ENGINES["vllm"])
    terms = StageCost(per_unit_s=0.05)
    seconds = {
        size: FrameworkCost(
            base, "critic", Framework(forward_micro_batch=4, critic_forward_micro_batch=size, values=terms)
        ).score_s(8 * 500.0, 8 * 500.0**2 / 2, 8)
        for size in (4, 2)
    }
    assert seconds[2] - seconds[4] == pytest.approx(2 * 0.05, rel=1e-9)


@pytest.mark.parametrize("role, bytes_per_param", [("actor", 4), ("critic", 4), ("reference", 2)])
def test_an_offloaded_role_copies_its_parameters_in_and_back_out_around_each_call(role, bytes_per_param):
    """verl loads an offloaded role's parameters before each call of its worker and offloads them after, inside the
    stage's timer: each GPU's shard over the host link twice a call, in float32 for FSDP's trainers (the actor and
    critic load as fp32, the reference as bf16). A scoring pass is one call; an update is one call around all its
    epochs and mini-batches (once a step, not in each pass); an offloaded actor's reshard is one more, at the host
    link (not the reshard's gather link). A role FSDP's CPU offload copies in at every gather makes no round trip."""
    from oppo.sim.cost.framework import Framework, FrameworkCost

    n, host = 4, 20e9
    base = RooflineCost(MODELS["qwen2.5-7b"], GPUS["h100"], n, ENGINES["vllm"], tensor_parallel=2)

    def cost(**changes):
        framework = Framework(sharded=True, host_bytes_per_s=host, weight_reshard=True, **changes)
        return FrameworkCost(base, role, framework)

    on_gpu, offloaded = cost(), cost(offload=(role,))
    round_trip = 2 * bytes_per_param * base.model.params / n / host
    work = (8 * 500.0, 8 * 500.0**2 / 2, 8)
    assert offloaded.score_s(*work) - on_gpu.score_s(*work) == pytest.approx(round_trip, rel=1e-9)
    assert offloaded.train_s(*work) == on_gpu.train_s(*work)  # a pass of the update: the copies are the call's
    assert on_gpu.update_host_s() == 0.0
    assert offloaded.update_host_s() == pytest.approx(round_trip if role != "reference" else 0.0, rel=1e-9)
    if role == "actor":
        assert offloaded.reshard_s() == on_gpu.reshard_s()
        assert offloaded.reshard_host_s() == pytest.approx(round_trip, rel=1e-9)
        moves = offloaded.step_load("gen").transfer_s - on_gpu.step_load("gen").transfer_s
        assert moves == pytest.approx(round_trip, rel=1e-9)
    if role == "reference":  # FSDP's CPU offload: copied in at each gather, no round trip (Megatron ignores it)
        assert cost(offload=(role,), offload_each_micro_batch=(role,)).score_s(*work) < offloaded.score_s(*work)
        megatron = dict(train_backend="megatron", sharded=False, train_tensor_parallel=2)
        copied = FrameworkCost(base, role, Framework(offload=(role,), offload_each_micro_batch=(role,), **megatron))
        loaded = FrameworkCost(base, role, Framework(offload=(role,), **megatron))
        assert (
            copied.score_s(*work)
            == loaded.score_s(*work)
            > FrameworkCost(base, role, Framework(**megatron)).score_s(*work)
        )
    else:  # verl wraps its scorers in CPU offload, never its trainers
        with pytest.raises(ValueError, match="offload_each_micro_batch"):
            Framework(offload=(role,), offload_each_micro_batch=(role,))


def test_an_updates_copies_are_priced_at_the_updates_share_of_the_host_link():
    """The copies around an update are the update stage's: its ``host_link_frac``, not the scoring pass's."""
    from oppo.sim.cost.framework import Framework, FrameworkCost
    from oppo.sim.cost.stage import StageCost

    base = RooflineCost(MODELS["qwen2.5-7b"], GPUS["h100"], 4, ENGINES["vllm"])
    plain = Framework(sharded=True, offload=("actor",), optimizer_offload=("actor",))
    shares = dict(update_actor=StageCost(host_link_frac=0.5), old_log_prob=StageCost(host_link_frac=0.25))
    nominal = FrameworkCost(base, "actor", plain).update_host_s()
    assert nominal > 0
    priced = FrameworkCost(base, "actor", dataclasses.replace(plain, **shares)).update_host_s()
    assert priced == pytest.approx(nominal / 0.5, rel=1e-12)


def test_an_update_pays_an_offloaded_trainers_copies_once_a_step_whatever_its_mini_batches():
    """The simulator charges the copies once around a step's updates: a step of 4 mini-batches and one of 1 differ
    in their updates' seconds by their passes alone (the round trip is not charged per mini-batch)."""
    from oppo.sim.model.trainer import SimConfig, simulate
    from oppo.sim.setup.toml_file import load_setup

    setup = load_setup("verl-qwen2.5-0.5b-gsm8k")
    fw = dataclasses.replace(setup.framework, offload=("actor", "critic"), optimizer_offload=("actor", "critic"))
    train = {}
    for minibatches in (1, 4):
        for offloaded in (False, True):
            changes = {"framework": fw} if offloaded else {}
            run = dataclasses.replace(setup, minibatches=minibatches, **changes)
            result = simulate(SimConfig(run.schedule(policy="sync"), run, steps=2, seed=0))
            rows = [r for r in result.trace if r.step == 1 and r.phase == "train_actor"]
            train[minibatches, offloaded] = sum(r.end_s - r.start_s for r in rows)
    copies = setup.costs("sync")["actor"]
    copies = dataclasses.replace(copies, framework=fw).update_host_s()
    assert copies > 0
    for minibatches in (1, 4):
        added = train[minibatches, True] - train[minibatches, False]
        assert added == pytest.approx(copies, rel=1e-6), minibatches


def test_a_log_replay_reads_an_updates_copies_as_its_host_load_once_a_step():
    """Replayed from a log, an offloaded trainer's update carries its copies as ``host_s`` (what the fit prices at
    the host link's share), once a step: the nominal round trip of its parameters and optimizer state."""
    from pathlib import Path

    from oppo.sim.logs.fit import replay
    from oppo.sim.logs.read import load_run_log
    from oppo.sim.setup.toml_file import load_setup

    setup = load_setup("verl-qwen2.5-0.5b-gsm8k")
    fw = dataclasses.replace(setup.framework, offload=("actor",), optimizer_offload=("actor",))
    setup = dataclasses.replace(setup, framework=fw)
    steps = list(load_run_log(Path(__file__).parent / "data" / "verl_qwen2.5_0.5b_resp512.log.gz").steps)[:3]
    host = np.broadcast_to(replay(setup, steps).loads["update_actor"].host_s, (3,))
    nominal = dataclasses.replace(
        setup.costs("sync")["actor"], framework=dataclasses.replace(fw, update_actor=StageCost())
    )
    np.testing.assert_allclose(host, nominal.update_host_s(), rtol=1e-6)


def test_the_host_link_is_each_gpus_datasheet_unless_the_setup_names_one():
    """An offloaded role's copies cross the GPU's own host link (per direction): PCIe 5.0 x16 on an H100, 4.0 on an
    A100, NVLink-C2C on a GH200, a PCIe 4.0 slot where a GPU names none; ``host_bytes_per_s`` overrides it."""
    from oppo.catalog.gpus import GPU, PCIE4_X16_BYTES_PER_S
    from oppo.sim.cost.framework import Framework, FrameworkCost

    model = MODELS["qwen2.5-7b"]
    bare = GPU("bare", 2e12, 300e12, 80e9, 300e9)  # a device whose datasheet names no host link
    expected = {"h100": 64e9, "a100": 32e9, "gh200": 450e9}
    for name, gpu in (*((n, GPUS[n]) for n in expected), ("bare", bare)):
        base = RooflineCost(model, gpu, 1, ENGINES["vllm"])
        seconds = FrameworkCost(base, "reference", Framework(offload=("reference",))).score_s(1.0, 1.0, 1)
        bare_s = FrameworkCost(base, "reference", Framework()).score_s(1.0, 1.0, 1)
        link = expected.get(name, PCIE4_X16_BYTES_PER_S)
        assert seconds - bare_s == pytest.approx(2 * model.weight_bytes / link, rel=1e-9), name
    base = RooflineCost(model, GPUS["gh200"], 1, ENGINES["vllm"])
    named = FrameworkCost(base, "reference", Framework(offload=("reference",), host_bytes_per_s=10e9))
    assert named.score_s(1.0, 1.0, 1) - FrameworkCost(base, "reference", Framework()).score_s(1.0, 1.0, 1) == (
        pytest.approx(2 * model.weight_bytes / 10e9, rel=1e-9)
    )


def test_an_fsdp_trainers_optimizer_on_the_host_is_copied_in_and_out_around_each_update():
    """``optimizer_offload``: Adam's two float32 moments of each GPU's shard (the whole of them where FSDP does not
    shard) over the host link before an update call and after it; a pass does not touch them. Megatron's optimizer
    offload is refused (not modelled)."""
    from oppo.sim.cost.framework import Framework, FrameworkCost

    n, host = 4, 20e9
    base = RooflineCost(MODELS["qwen2.5-7b"], GPUS["h100"], n, ENGINES["vllm"])
    for sharded, shards in ((True, n), (False, 1)):
        kept, offloaded = (
            FrameworkCost(base, "critic", Framework(optimizer_offload=roles, host_bytes_per_s=host, sharded=sharded))
            for roles in ((), ("critic",))
        )
        work = (8 * 500.0, 8 * 500.0**2 / 2, 8)
        assert offloaded.update_host_s() == pytest.approx(2 * 8 * base.model.params / shards / host, rel=1e-9)
        assert kept.update_host_s() == 0.0
        assert offloaded.score_s(*work) == kept.score_s(*work) and offloaded.train_s(*work) == kept.train_s(*work)
    with pytest.raises(ValueError, match="optimizer_offload"):
        Framework(optimizer_offload=("actor",), train_backend="megatron", sharded=False)
    with pytest.raises(ValueError, match="optimizer_offload"):
        Framework(optimizer_offload=("reference",))


def test_a_sharded_pass_moves_the_parameters_over_the_interconnect_per_micro_batch():
    """FSDP / ZeRO-3: each scoring micro-batch all-gathers the (n - 1) / n of the weights a GPU lacks, each training
    micro-batch gathers for forward and backward and reduce-scatters the gradients (3x), over the collective's
    link. Serial (exposed_gather_frac 1) the difference to the unsharded pass is exactly those bytes over that link
    (to 1e-9); with prefetch the pass costs the larger of compute and gathers plus the exposed share of the
    smaller; a slower achieved link (gather_bandwidth_frac) stretches the gathers by its inverse."""
    from oppo.sim.cost.framework import Framework, FrameworkCost
    from oppo.sim.cost.stage import StageCost

    model, gpu = MODELS["deepseek-llm-7b"], GPUS["mi300x"]
    base = RooflineCost(model, gpu, 8, ENGINES["vllm"])
    gather = model.weight_bytes * 7 / 8 / gpu.link_bytes_per_s  # seconds, one all-gather
    rows, tokens = 64.0, 64.0 * 300  # 8 rows per GPU: 2 forward micro-batches, 4 training micro-batches

    def extra(values: StageCost, link: float = gpu.link_bytes_per_s) -> tuple[float, float, float, float]:
        """(scoring, training) seconds of the sharded pass minus the unsharded one, and the unsharded ones."""
        stages = dict(values=values, update_critic=values)
        flat = FrameworkCost(base, "critic", Framework(forward_micro_batch=4, train_micro_batch=2, **stages), link)
        sharded = FrameworkCost(base, "critic", dataclasses.replace(flat.framework, sharded=True), link)
        score, train = (tokens, tokens * 150, rows), (tokens, tokens * 150, rows)
        return (
            sharded.score_s(*score) - flat.score_s(*score),
            sharded.train_s(*train) - flat.train_s(*train),
            flat.score_s(*score),
            flat.train_s(*train),
        )

    score, train, _, _ = extra(StageCost(exposed_gather_frac=1.0))
    assert score == pytest.approx(2 * gather, rel=1e-9)
    assert train == pytest.approx(4 * 3 * gather, rel=1e-9)
    score, train, flat_score, flat_train = extra(StageCost(exposed_gather_frac=0.25))
    assert score == pytest.approx(max(flat_score, 2 * gather) + 0.25 * min(flat_score, 2 * gather) - flat_score)
    assert train == pytest.approx(max(flat_train, 12 * gather) + 0.25 * min(flat_train, 12 * gather) - flat_train)
    # a 1 GB/s link: gather-bound, the pass costs its gathers (at half the link: twice them) plus 25% of compute
    slow = gpu.link_bytes_per_s / 1e9
    score, _, flat_score, _ = extra(StageCost(exposed_gather_frac=0.25, gather_bandwidth_frac=0.5), link=1e9)
    assert score + flat_score == pytest.approx(2 * 2 * gather * slow + 0.25 * flat_score, rel=1e-9)
    one_gpu = FrameworkCost(RooflineCost(model, gpu, 1, ENGINES["vllm"]), "critic", Framework(sharded=True), 1e9)
    assert one_gpu._gather_s() == 0.0  # nothing to gather from


def test_across_nodes_a_collective_runs_a_ring_channel_over_each_card():
    """Without [cluster] inter_node_bytes_per_s, a collective across nodes runs at the GPU's reference system's
    cards (DGX H100: 400 Gb/s NDR, 50 GB/s a GPU; DGX A100: 200 Gb/s HDR, 25 GB/s), one NCCL ring channel over each:
    8 GPUs a node carry it at 8 cards' bandwidth, up to the intra-node link (H100: 400 GB/s under NVLink's 450;
    A100: 200 under 300); 4 a node at 4 cards'; the setup's figure overrides the card's; a GPU that names no card
    asks for the setup's."""
    from oppo.sim.setup.presets import Cluster

    assert Cluster().link_bytes_per_s(GPUS["h100"], first=0, n_gpus=16) == 8 * 50e9
    assert Cluster().link_bytes_per_s(GPUS["a100"], first=0, n_gpus=16) == 8 * 25e9
    assert Cluster(gpus_per_node=4).link_bytes_per_s(GPUS["a100"], first=0, n_gpus=8) == 4 * 25e9
    fast = Cluster(inter_node_bytes_per_s=100e9)
    assert fast.link_bytes_per_s(GPUS["h100"], first=0, n_gpus=16) == GPUS["h100"].link_bytes_per_s  # NVLink-bound
    with pytest.raises(ValueError, match="inter_node_bytes_per_s"):
        Cluster().link_bytes_per_s(GPUS["cpu-core"], first=0, n_gpus=16)


def test_a_collective_spanning_nodes_takes_the_inter_node_link(tmp_path):
    from oppo.sim.setup.presets import Cluster
    from oppo.sim.setup.toml_file import load_setup

    cluster, gpu = Cluster(gpus_per_node=8, inter_node_bytes_per_s=25e9), GPUS["h100"]
    assert cluster.link_bytes_per_s(gpu, first=0, n_gpus=8) == gpu.link_bytes_per_s  # one node: NVLink
    assert cluster.link_bytes_per_s(gpu, first=0, n_gpus=16) == 8 * 25e9  # two nodes: 8 cards a node
    # a rollout engine of tensor parallel 16 over two nodes pays its all-reduces over the slower link
    path = tmp_path / "two-nodes.toml"
    path.write_text(
        'base = "verl-deepseek-llm-7b-ppo-8xmi300x"\n[placement]\nactor_gpus = 16\n'
        "[cluster]\ngpus_per_node = 8\ninter_node_bytes_per_s = 25e9\n[framework]\nrollout_tensor_parallel = 16\n"
    )
    setup = load_setup(str(path))
    assert setup.costs()["actor"].base.allreduce_bytes_per_s == 8 * 25e9
    assert setup.costs()["critic"].collective_bytes_per_s == 8 * 25e9
    path.write_text('base = "paper-7b-h200"\n[cluster]\ngpus_per_node = 0\n')
    with pytest.raises(ValueError, match="gpus_per_node >= 1"):
        load_setup(str(path))


def test_whether_a_group_spans_nodes_follows_its_gpus_positions(tmp_path):
    """Node boundaries sit at multiples of gpus_per_node: two GPUs 3 and 4 at 4 per node are on two nodes although
    two GPUs fit in one; a tensor-parallel engine of 4 on GPUs 4-7 at 6 per node straddles the boundary at 6."""
    from oppo.sim.setup.presets import Cluster
    from oppo.sim.setup.toml_file import load_setup

    cluster, gpu = Cluster(gpus_per_node=4, inter_node_bytes_per_s=25e9), GPUS["h200"]
    assert cluster.link_bytes_per_s(gpu, first=4, n_gpus=4) == gpu.link_bytes_per_s  # GPUs 4-7: node 1 alone
    assert cluster.link_bytes_per_s(gpu, first=3, n_gpus=2) == 25e9  # GPUs 3-4: one a node, one card each
    assert cluster.link_bytes_per_s(gpu, first=0, n_gpus=8, group=4) == gpu.link_bytes_per_s  # 0-3, 4-7
    assert cluster.link_bytes_per_s(gpu, first=2, n_gpus=8, group=4) == 2 * 25e9  # 2-5 spans: 2 cards a node
    assert cluster.link_bytes_per_s(gpu, first=1, n_gpus=4) == 25e9  # 1-4: 3 GPUs in node 0, 1 in node 1
    # groups straddling unevenly: 0-4 (4 + 1 a node) and 5-9 (3 + 2): the one with a lone GPU sets the pace
    assert cluster.link_bytes_per_s(gpu, first=0, n_gpus=10, group=5) == 25e9
    path = tmp_path / "straddle.toml"
    path.write_text(
        'base = "paper-7b-h200"\n[placement]\nactor_gpus = 3\nreward_gpus = 2\n'
        "[cluster]\ngpus_per_node = 4\ninter_node_bytes_per_s = 25e9\n"
    )
    costs = load_setup(str(path)).costs()
    assert costs["reward"].collective_bytes_per_s == 25e9  # GPUs 3-4: its ZeRO-3 gathers cross the network
    assert costs["actor"].collective_bytes_per_s == gpu.link_bytes_per_s  # GPUs 0-2
    path.write_text(
        'base = "verl-deepseek-llm-7b-ppo-8xmi300x"\n[cluster]\ngpus_per_node = 6\n[framework]\n'
        "rollout_tensor_parallel = 4\n"
    )
    setup = load_setup(str(path))
    # the engine on GPUs 4-7 spans nodes, 2 GPUs in each: 2 network cards (the MI300X platform's 400 Gb/s each)
    assert setup.costs()["actor"].base.allreduce_bytes_per_s == 2 * GPUS["mi300x"].nic_bytes_per_s == 100e9


def test_strided_groups_cross_nodes_at_their_fewest_gpus_in_one():
    """Groups of GPUs ``stride`` apart: at 8 on 2 nodes of 8 each group is GPU i and i + 8, one a node, one card
    each (50 GB/s a GPU on an H100 system), not the 16 GPUs' 8 cards a node; at 2, groups of 8 GPUs with 4 a node,
    4 cards'."""
    from oppo.sim.setup.presets import Cluster

    cluster, gpu = Cluster(), GPUS["h100"]
    assert cluster.link_bytes_per_s(gpu, first=0, n_gpus=16, stride=8) == 50e9
    assert cluster.link_bytes_per_s(gpu, first=0, n_gpus=16, stride=2) == 4 * 50e9
    assert cluster.link_bytes_per_s(gpu, first=0, n_gpus=8, stride=2) == gpu.link_bytes_per_s  # one node


def test_megatrons_groups_in_its_rank_order():
    """Megatron-LM numbers its ranks tensor, then data, then pipeline parallel (``tp-cp-ep-dp-pp``): on 2 nodes of
    8 H100 at TP 2 x PP 2 the data-parallel groups are GPUs 0, 2, 4, 6 (one node: NVLink), not 0, 4, 8, 12; the
    pipeline groups GPU i and i + 8, one a node, one card each; a TP 8 x PP 2 layout has data groups of one GPU."""
    from oppo.sim.cost.gpu import megatron_groups
    from oppo.sim.setup.presets import Cluster

    groups = megatron_groups(0, 16, tp=2, pp=2)
    assert groups["tensor"][:2] == [range(0, 2), range(2, 4)]
    assert [list(g) for g in groups["data"][:2]] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert [list(g) for g in groups["pipeline"][:2]] == [[0, 8], [1, 9]]
    assert sorted(g for group in groups["data"] for g in group) == list(range(16))
    cluster, gpu = Cluster(), GPUS["h100"]
    assert cluster.link_bytes_per_s(gpu, 0, 16, members=groups["data"]) == gpu.link_bytes_per_s
    assert cluster.link_bytes_per_s(gpu, 0, 16, members=groups["pipeline"]) == 50e9


def test_switching_the_scorer_in_a_toml_switches_the_reward_terms(tmp_path):
    """A rule reward is CPU time per sequence; a reward model a forward pass (the reference's terms). A TOML that
    turns a preset's reward model into a rule must not charge the model's per-micro-batch terms per sequence."""
    from oppo.sim.cost.framework import trl_layer
    from oppo.sim.cost.stage import StageLoad
    from oppo.sim.setup.toml_file import load_setup

    path = tmp_path / "rule.toml"
    path.write_text('base = "paper-7b-h200"\nreward = "rule"\n')
    rule = load_setup(str(path))
    assert rule.reward is None
    assert rule.framework.reward == trl_layer(rule_reward=True).reward
    assert rule.framework.reward != rule.framework.ref
    scored = StageLoad(units=112.0, steps=1.0)  # B sequences scored in a step
    assert rule.framework.reward.seconds(scored) == trl_layer(rule_reward=True).reward.seconds(scored)
    path.write_text(
        'base = "paper-7b-gh200-gsm8k"\nreward = "qwen2.5-7b"\n[placement]\nactor_gpus = 3\nreward_gpus = 1\n'
    )
    model = load_setup(str(path))  # the other way: a rule preset given a reward model scores with a forward pass
    assert model.framework.reward == model.framework.ref
    path.write_text('base = "paper-7b-h200"\nreward = "rule"\n[framework.reward]\nper_unit_s = 1e-3\n')
    assert load_setup(str(path)).framework.reward.per_unit_s == 1e-3  # set by hand: kept


def test_fit_gpus_prints_each_gpus_fractions_and_where_they_come_from():
    res = invoke.sim("fit-gpus")
    assert res.returncode == 0, res.stderr
    mi300x = next(line for line in res.stdout.splitlines() if line.startswith("mi300x"))
    assert "0.392" in mi300x and "(from h100 x 0.636 matmul ceiling)" in mi300x
    assert next(line for line in res.stdout.splitlines() if line.startswith("h100")).endswith("(from h100)")


def test_a_config_json_is_parsed_once_while_unchanged_and_again_once_changed(tmp_path):
    """model_shape keeps a file's shape by its content: a rewrite of the same size within the same instant is read."""
    import json

    from oppo.catalog.shapes import HF_SHAPES
    from oppo.sim.cost import engine

    path = tmp_path / "config.json"
    config = dict(HF_SHAPES["qwen2.5-0.5b"])
    path.write_text(json.dumps(config))
    first = engine.model_shape(str(path))
    assert engine.model_shape(str(path)) is first  # cached
    path.write_text(json.dumps(config | {"num_hidden_layers": 12}))  # the same size: 24 -> 12
    assert engine.model_shape(str(path)).layers == 12
