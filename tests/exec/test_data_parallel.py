"""The data-parallel actor group (``--dp N``): N ranks take exactly the steps one rank takes, stay identical,
and a rank that dies ends the run cleanly. Rank processes are found by the ids the run prints
(``placement: actor rank R on DEVICE (worker pid N, node ID): ROLES``): the tests stop only processes they
started."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np
import pytest
import torch

pytest.importorskip("ray")

from oppo.core.config import POLICIES  # noqa: E402
from oppo.core.scheduler import Scheduler  # noqa: E402
from oppo.exec.compute.timing import Recorder  # noqa: E402
from oppo.exec.compute.update import deal, longest_first, minibatches, weights_digest  # noqa: E402
from oppo.exec.config import ExecConfig, ModelConfig, PPOConfig, default_schedule  # noqa: E402
from oppo.exec.models.roles import load_roles  # noqa: E402
from oppo.exec.step.parts import run_roles  # noqa: E402
from oppo.exec.step.rank import trained_roles  # noqa: E402
from oppo.exec.step.runner import Executor, RunAborted, SeqData  # noqa: E402
from tests.drive import run_step  # noqa: E402
from tests.exec.test_placement import alive, kill_mid_run  # noqa: E402

RANK_LINE = re.compile(r"actor rank (\d+) on (\S+) \(worker pid (\d+), node (\w+)\)")
ROOT = Path(__file__).resolve().parents[2]


def config_for(
    policy: str,
    dp: int,
    algo: str,
    placement: str,
    shard: bool = False,
    dtype="float64",
    batch: int = 4,
    minibatches: int = 2,
    steps: int = 4,
    model: dict | None = None,
    ray_address: str | None = None,
) -> ExecConfig:
    groups = {"algo": "grpo", "group_size": 2} if algo == "grpo" else {}
    schedule = default_schedule(policy=policy, batch=batch, max_new_tokens=24, delta="2", check_tokens=4, **groups)
    return ExecConfig(
        schedule=schedule,
        model=ModelConfig(**{"dtype": dtype} | (model or {})),
        ppo=PPOConfig(minibatches=minibatches),
        steps=steps,
        seed=7,
        dp=dp,
        check_ranks=dp > 1,
        placement=placement,
        shard=shard,
        ray_address=ray_address,
    )


def head_is_embedding(state: dict[str, torch.Tensor]) -> bool:
    return torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"])


def flat(state: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.flatten() for v in state.values()])


class Run(NamedTuple):
    observed: list[tuple[float, float, float]]  # per step: mean reward, actor and critic gradient norms
    ids: list[list[int]]  # per step: the trained sequences
    weights: dict[str, dict[str, torch.Tensor]]  # the trained roles' final state dicts
    devices: set[tuple[str, str]]  # (role, device) pairs of the trace
    held: list[tuple[str, ...]] | None  # the roles each rank loaded (ranks in Ray workers)


def run(policy: str, dp: int, algo: str = "ppo", placement: str = "colocated", shard: bool = False, **sizes) -> Run:
    """A run with ``dp`` ranks. ``sizes``: dtype, batch, minibatches, steps, model (ModelConfig fields),
    ray_address (a cluster to join)."""
    config = config_for(policy, dp, algo, placement, shard, **sizes)
    torch.manual_seed(config.seed)
    if dp == 1 and placement == "colocated":
        executor = Executor.colocated(config, load_roles(config.model, which=run_roles(config)), Recorder())
    else:
        from oppo.exec.distributed.placement import RayExecutor

        executor = RayExecutor(config, Recorder())
    try:
        steps = [executor.step() for _ in range(config.steps)]
        weights = {role: executor.group.first("state", role) for role in trained_roles(config)}
        devices = {(row.role, row.device) for row in executor.rec.rows}
        held = getattr(executor.group, "held", None)
    finally:
        executor.close()
    observed = [(m.mean_reward, m.actor_grad_norm, m.critic_grad_norm) for _, m in steps]  # per step
    return Run(observed, [[t.seq_id for t in o.trained] for o, _ in steps], weights, devices, held)


def run_in_child(tmp_path: Path, ray, timeout_s: float = 240, **kwargs):
    """:func:`run` in a child process, stopped with every process it started (its session) after ``timeout_s``: a
    run that hangs (a rank waiting in a collective its peer never joins) fails the test instead of hanging it. The
    child joins ``ray`` (the tests' shared local Ray) rather than starting its own."""
    kwargs["ray_address"] = ray.get_runtime_context().gcs_address
    out = tmp_path / "run.pt"
    code = f"import torch; from tests.exec.test_data_parallel import run; torch.save(run(**{kwargs!r}), {str(out)!r})"
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the child this test started, and what it started
        proc.communicate()
        pytest.fail(f"the run did not end within {timeout_s} s: {kwargs}")
    assert proc.returncode == 0, err
    return torch.load(out, weights_only=False)


def assert_same_steps(one: Run, two: Run, roles: tuple[str, ...] = ("actor", "critic"), rel: float = 1e-10) -> None:
    """Two runs trained the same sequences, with the same rewards and gradient norms, to the same weights."""
    assert two.ids == one.ids
    # rewards and the gradients' norms (before clipping: a sum over ranks taken as a mean would show here)
    assert np.ravel(two.observed) == pytest.approx(np.ravel(one.observed), rel=rel)
    assert min(norm for _, norm, _ in one.observed) > 0
    for role in roles:
        a, b = flat(one.weights[role]), flat(two.weights[role])
        assert a.dtype == b.dtype == torch.float64
        assert float((a - b).abs().max()) <= rel * float(a.abs().max()), role


@pytest.mark.parametrize(
    "policy, algo, placement, shard",
    [
        # unsharded: the disaggregated case covers whole weights all-reduced, the sharded ones the reward on the driver
        pytest.param("sync", "ppo", "colocated", False, marks=pytest.mark.slow),
        pytest.param("oppo", "ppo", "colocated", False, marks=pytest.mark.slow),  # sync and sharded oppo cover it
        # GRPO unsharded: the sharded GRPO case below covers the same targets (-m slow runs it too)
        pytest.param("oppo", "grpo", "colocated", False, marks=pytest.mark.slow),
        ("oppo", "ppo", "disaggregated", False),
        pytest.param("oppo", "ppo", "colocated", True, id="oppo-ppo-colocated-True-uneven"),
        pytest.param("oppo", "grpo", "colocated", True, id="oppo-grpo-colocated-True-tied"),
    ],
)
def test_two_ranks_take_the_steps_of_one_in_float64(policy, algo, placement, shard, shared_ray, request, tmp_path):
    """Same trained sequences, rewards and final weights to 1e-10 relative: the loss is normalised by the
    minibatch's global token count and the gradients are summed over the ranks. (Two ranks reduce the gradient
    in another order than one batch: the last bits may differ.) The two-rank run checks every step that its
    ranks hold bit-identical weights (``check_ranks``). GRPO: group advantages over the whole batch; with the
    reward model in its own worker, the two-rank run streams to it as the one-rank run does locally. Sharded
    (FSDP2): parameters, gradients and Adam states split over the ranks, gradients reduce-scattered. Sharded GRPO
    trains a Qwen2 whose output head is its input embedding (Qwen2.5 0.5B-3B, Llama 3.2, Gemma): as two FSDP units
    they would be two copies, each updated with part of the gradient, and the run would differ from the first
    update on; the head must still be the embedding after training. Sharded PPO trains 7 rows in minibatches of
    3, 2 and 2 (:func:`test_uneven_minibatches_on_two_ranks_take_the_steps_of_one`), its two ranks in a child
    process with a deadline: a rank without a row would leave its peer waiting in FSDP's reduce-scatter."""
    tied = request.getfixturevalue("tied_model") if algo == "grpo" and shard else None
    uneven = dict(batch=7, minibatches=3) if algo == "ppo" and shard else {}
    one = run(policy, 1, algo, model=tied, **uneven)
    if uneven:
        two = run_in_child(tmp_path, shared_ray, policy=policy, dp=2, algo=algo, shard=True, **uneven)
    else:
        two = run(policy, 2, algo, placement, shard, model=tied)
    roles = ("actor",) if algo == "grpo" else ("actor", "critic")
    assert_same_steps(one, two, roles)
    if tied:
        assert head_is_embedding(one.weights["actor"]) and head_is_embedding(two.weights["actor"])
    assert {d for role, d in two.devices if role == "actor"} == {"cpu0", "cpu1"}  # one device per rank (records)
    # the reward model: on the driver (the device after the ranks), or in its own worker
    assert ("reward", "cpu3" if placement == "disaggregated" else "cpu2") in two.devices
    assert two.held == [("actor", *roles[1:], "reference")] * 2  # GRPO: no critic loaded
    for role in roles:
        assert not torch.equal(flat(two.weights[role]), flat_weights_at_start(role, tied)), "the run should change them"


@pytest.mark.slow  # float64 equivalence above is the correctness check; this one guards the float32 collectives
def test_sharded_ranks_in_float32_stay_close_to_one():
    """The default dtype on CPU: FSDP2's collectives must be ones gloo has (a plain sum); float32 sums in another
    order than one batch, so rewards agree to 1e-4 only."""
    one = run("oppo", 1, dtype="float32").observed
    two = run("oppo", 2, shard=True, dtype="float32").observed
    assert np.ravel(two) == pytest.approx(np.ravel(one), rel=1e-4, abs=1e-4)


# unsharded, a rank without a row would all-reduce zeros; sharded, it would hang (the default run has that case in
# test_two_ranks_take_the_steps_of_one_in_float64's sharded PPO case, with oppo over 4 steps)
@pytest.mark.parametrize("shard", [False, True])
@pytest.mark.slow
def test_uneven_minibatches_on_two_ranks_take_the_steps_of_one(tmp_path, shard, shared_ray):
    """7 rows in 3 minibatches: 3, 2, 2 rows, each dealt to both ranks (sharded, a rank without a row would leave
    its peer waiting in FSDP's reduce-scatter: the two-rank run is a child process with a deadline)."""
    sizes = dict(batch=7, minibatches=3, steps=1)
    one = run("sync", 1, **sizes)
    if shard:
        two = run_in_child(tmp_path, shared_ray, policy="sync", dp=2, shard=True, **sizes)
    else:  # (whole weights: a rank without a row all-reduces zeros with its peer)
        two = run("sync", 2, **sizes)
    assert_same_steps(one, two)


def flat_weights_at_start(role: str, model: dict | None = None) -> torch.Tensor:
    roles = load_roles(ModelConfig(**{"dtype": "float64"} | (model or {})), which=(role,))
    return torch.cat([v.flatten() for v in getattr(roles, role).state_dict().values()])


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"shard": True, "dp": 1}, "--shard needs --dp 2"),
        ({"shard": True, "dp": 4}, "at least --dp rows"),
        ({"dp": 0}, "dp must be > 0"),
        ({"ppo": PPOConfig(minibatches=5)}, "minibatches 5 > batch x group size 4"),
    ],
)
def test_bad_data_parallel_settings_are_refused(changes, message):
    schedule = default_schedule(batch=4)  # minibatches of 2 rows
    with pytest.raises(ValueError, match=message):
        ExecConfig(schedule=schedule, **{"dp": 2} | changes)


@pytest.mark.parametrize(
    "args",
    [
        ["--dp", "2", "--shard", "--batch", "3", "--minibatches", "2"],  # minibatches of 2 and 1 rows
        ["--batch", "2", "--minibatches", "4"],  # two minibatches would have no row
    ],
)
def test_minibatches_without_a_row_per_rank_are_refused_in_one_line(tmp_path, args):
    cmd = [sys.executable, "-m", "oppo.exec.train", *args, "--steps", "1", "--out", str(tmp_path / "run")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error: ") and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "run").exists()


def test_minibatches_are_the_number_asked_and_differ_by_one_row_at_most():
    """``torch.tensor_split``: 7 rows in 3 minibatches are 3, 2, 2 (``torch.chunk`` gives 3, 3, 1), 6 in 4 are
    2, 2, 1, 1 (``chunk``: 3 minibatches); each epoch is a permutation of the rows."""
    for rows, asked, sizes in ((7, 3, [3, 2, 2]), (6, 4, [2, 2, 1, 1]), (8, 2, [4, 4])):
        cut = minibatches(rows, PPOConfig(epochs=2, minibatches=asked), seed=3)
        assert [len(mb) for mb in cut] == sizes * 2
        for epoch in (cut[:asked], cut[asked:]):
            assert sorted(torch.cat(epoch).tolist()) == list(range(rows))


class Lengths(dict):
    """A response length for every sequence id, drawn at its first look-up (some beyond the cap)."""

    def __init__(self, seed: int, most: int) -> None:
        super().__init__()
        self.rng, self.most = np.random.default_rng(seed), most

    def __missing__(self, seq_id: int) -> int:
        self[seq_id] = int(self.rng.integers(1, self.most))
        return self[seq_id]


@pytest.mark.parametrize("group_size", [1, 3])
@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "async"])
def test_every_step_trains_batch_x_group_size_rows(policy, group_size):
    """The rows of a step, which the minibatch check counts on (``--shard``: the smallest minibatch,
    floor(B x G / minibatches) rows, must give every rank one): each policy the executor runs trains B x G
    sequences every step, carried ones and T-PPO's segments included; a trained sequence that reached the cap is
    finished, and only T-PPO trains unfinished ones (so PPO scores exactly the finished ones)."""
    if policy == "tppo" and group_size > 1:
        pytest.skip("T-PPO trains single samples")
    algo = {"algo": "grpo", "group_size": group_size} if group_size > 1 else {}
    cap, batch = 24, 5
    config = default_schedule(policy=policy, batch=batch, max_new_tokens=cap, window_tokens=8, check_tokens=4, **algo)
    scheduler, lengths = Scheduler(config), Lengths(seed=group_size, most=2 * cap)
    for step in range(40):
        _, outcome, _ = run_step(scheduler, lengths, now=float(step))
        assert len(outcome.trained) == batch * group_size, (policy, step)
        for t in outcome.trained:
            assert t.finished or (policy == "tppo" and t.response_tokens < cap), (policy, step, t)


def test_deal_balances_tokens_and_keeps_order():
    rows, tokens = torch.tensor([5, 2, 7, 1]), torch.tensor([10, 40, 20, 30])
    shares = deal(rows, tokens, 2)
    # longest first: 40 -> rank 0, 30 -> rank 1, 20 -> rank 1, 10 -> rank 0: 50 tokens each, in minibatch order
    assert [s.tolist() for s in shares] == [[5, 2], [7, 1]]
    assert sorted(torch.cat(shares).tolist()) == sorted(rows.tolist())
    assert [s.tolist() for s in deal(rows, tokens, 1)] == [rows.tolist()]
    assert [len(s) for s in deal(rows[:1], tokens[:1], 3)] == [1, 0, 0]  # a rank may get no row
    many = torch.arange(9)
    for seed in range(20):  # rows >= ranks: every rank gets one (what a sharded minibatch step needs)
        work = torch.randint(1, 50, (9,), generator=torch.Generator().manual_seed(seed))
        assert all(len(share) >= 1 for share in deal(many, work, 4))


def test_one_dealer_for_new_sequences_and_minibatch_rows():
    """Longest first, each to the least loaded rank (ties: the lower rank; equal work: in the given order). The
    executor deals the sequences new to the group with it, on top of what the carried ones already load."""
    assert longest_first([10, 40, 20, 30], 2) == [0, 0, 1, 1]
    assert longest_first([5, 5, 5], 2, load=[12, 0]) == [1, 1, 1]
    assert longest_first([5, 5, 5], 3, load=[1, 0, 0]) == [1, 2, 0]

    executor = Executor.__new__(Executor)
    executor.group = SimpleNamespace(size=2)
    executor.data = {i: SeqData(prompt=[3] * 4, response=[3] * r) for i, r in enumerate([8, 0, 0, 0])}
    executor.rank_of = {0: 0}  # carried, with 12 tokens and a budget of 4 on rank 0
    plan = SimpleNamespace(active=(0, 1, 2, 3), budgets={0: 4, 1: 10, 2: 2, 3: 10})
    executor._deal(plan)
    # work 16 (carried), 14, 6, 14: 1 -> rank 1 (0), 3 -> rank 1 (14 < 16), 2 -> rank 0 (16 < 28)
    assert executor.rank_of == {0: 0, 1: 1, 2: 0, 3: 1}
    assert [executor.rank_of[i] for i in (1, 2, 3)] == longest_first([14, 6, 14], 2, load=[16, 0])


def test_grpo_loads_no_critic():
    """GRPO trains no critic: a run loads none (the ranks' own roles: in the two-rank tests above)."""
    grpo, ppo = (config_for("oppo", 2, algo, "colocated") for algo in ("grpo", "ppo"))
    assert run_roles(grpo) == ("actor", "reference", "reward") and trained_roles(grpo) == ("actor",)
    assert run_roles(ppo) == ("actor", "reference", "critic", "reward") and trained_roles(ppo) == ("actor", "critic")
    executor = Executor.colocated(grpo, load_roles(grpo.model, which=run_roles(grpo)), Recorder())
    assert executor.group.rank.roles.critic is None
    executor.step()


def test_a_rank_that_drifts_is_caught():
    """The debug check compares bit-exact digests of the ranks' weights."""
    model = torch.nn.Linear(3, 2).double()
    before = weights_digest(model)
    assert weights_digest(model) == before
    with torch.no_grad():
        model.weight[0, 0] = torch.nextafter(model.weight[0, 0], torch.tensor(2.0, dtype=torch.float64))
    assert weights_digest(model) != before

    class Drifted:
        size = 2

        def call(self, method, args):
            return ["a1b2", "c3d4"] if method == "digest" else None

    executor = Executor.__new__(Executor)
    executor.group = Drifted()
    with pytest.raises(RunAborted, match="step 3: the ranks' weights differ"):
        executor._check_ranks(3)


TRAIN = [sys.executable, "-m", "oppo.exec.train", "--policy", "oppo", "--batch", "4", "--dp", "2"]


def rank_pids(stderr: str) -> list[int]:
    return [int(m.group(3)) for m in RANK_LINE.finditer(stderr)]


@pytest.mark.slow  # tests/exec/test_placement.py kills a scorer worker the same way in the default run
def test_dead_rank_ends_run_with_records(tmp_path):
    out = tmp_path / "dies"
    cmd = [*TRAIN, "--steps", "100000", "--out", str(out)]
    code, err, pids = kill_mid_run(cmd, out, tmp_path / "stderr.txt", rank_pids, count=2, victim=1)
    assert code == 1, err
    assert "actor rank's worker died" in err
    assert json.loads((out / "summary.json").read_text())["steps"] >= 10
    deadline = time.monotonic() + 30  # the other rank exits with the run
    while alive(pids[0]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(pids[0])


@pytest.mark.slow  # two Ray nodes start and stop: ~20 s idle, over a minute on a busy machine
def test_two_node_cluster(tmp_path):
    """A local Ray cluster of two nodes, one core each, started and stopped by this test: the two ranks land on
    different nodes and train together."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1}, shutdown_at_exit=False)
    try:
        cluster.add_node(num_cpus=1)
        out = tmp_path / "cluster"
        res = subprocess.run(
            [*TRAIN, "--steps", "3", "--ray-address", cluster.address, "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        cluster.shutdown()
    assert res.returncode == 0, res.stderr
    nodes = {m.group(4) for m in RANK_LINE.finditer(res.stderr)}
    assert len(nodes) == 2, res.stderr
    assert json.loads((out / "summary.json").read_text())["steps"] == 3
