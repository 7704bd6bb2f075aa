"""The data-parallel actor group (``--dp N``): N ranks take exactly the steps one rank takes, stay identical,
and a rank that dies ends the run cleanly. Rank processes are found by the ids the run prints
(``placement: actor rank R on DEVICE (worker pid N, node ID)``): the tests stop only processes they started."""

import json
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

pytest.importorskip("ray")

from oppo.exec.config import ExecConfig, ModelConfig, default_schedule  # noqa: E402
from oppo.exec.models import load_roles  # noqa: E402
from oppo.exec.runner import Executor, RunAborted  # noqa: E402
from oppo.exec.timing import Recorder  # noqa: E402
from oppo.exec.update import deal, weights_digest  # noqa: E402
from tests.exec.test_placement import alive, kill_mid_run  # noqa: E402

RANK_LINE = re.compile(r"actor rank (\d+) on (\S+) \(worker pid (\d+), node (\w+)\)")


def config_for(policy: str, dp: int, algo: str, placement: str, shard: bool = False, dtype="float64") -> ExecConfig:
    groups = {"algo": "grpo", "group_size": 2} if algo == "grpo" else {}
    schedule = default_schedule(policy=policy, batch=4, max_new_tokens=24, delta="2", check_tokens=4, **groups)
    return ExecConfig(
        schedule=schedule,
        model=ModelConfig(dtype=dtype),
        steps=4,
        seed=7,
        dp=dp,
        check_ranks=dp > 1,
        placement=placement,
        shard=shard,
    )


def flat_weights(executor, role: str) -> torch.Tensor:
    state = executor.group.first("state", role)
    return torch.cat([v.flatten() for v in state.values()])


def run(policy: str, dp: int, algo: str = "ppo", placement: str = "colocated", shard: bool = False, dtype="float64"):
    """Rewards and gradient norms per step, trained ids, final actor and critic weights and (role, device) pairs
    of a run with ``dp`` ranks."""
    config = config_for(policy, dp, algo, placement, shard, dtype)
    torch.manual_seed(config.seed)
    if dp == 1 and placement == "colocated":
        executor = Executor.colocated(config, load_roles(config.model), Recorder())
    else:
        from oppo.exec.placement import RayExecutor

        executor = RayExecutor(config, Recorder())
    try:
        steps = [executor.step() for _ in range(config.steps)]
        weights = {role: flat_weights(executor, role) for role in ("actor", "critic")}
        devices = {(row.role, row.device) for row in executor.rec.rows}
    finally:
        executor.close()
    observed = [(m.mean_reward, m.actor_grad_norm, m.critic_grad_norm) for _, m in steps]  # per step
    return observed, [[t.seq_id for t in o.trained] for o, _ in steps], weights, devices


@pytest.mark.parametrize(
    "policy, algo, placement, shard",
    [
        ("sync", "ppo", "colocated", False),
        ("oppo", "ppo", "colocated", False),
        ("oppo", "grpo", "colocated", False),
        ("oppo", "ppo", "disaggregated", False),
        ("oppo", "ppo", "colocated", True),
        ("oppo", "grpo", "colocated", True),
    ],
)
def test_two_ranks_take_the_steps_of_one_in_float64(policy, algo, placement, shard):
    """Same trained sequences, rewards and final weights to 1e-10 relative: the loss is normalised by the
    minibatch's global token count and the gradients are summed over the ranks. (Two ranks reduce the gradient
    in another order than one batch: the last bits may differ.) The two-rank run checks every step that its
    ranks hold bit-identical weights (``check_ranks``). GRPO: group advantages over the whole batch; with the
    reward model in its own worker, the two-rank run streams to it as the one-rank run does locally. Sharded
    (FSDP2): parameters, gradients and Adam states split over the ranks, gradients reduce-scattered."""
    one_observed, one_ids, one_weights, _ = run(policy, 1, algo)
    two_observed, two_ids, two_weights, devices = run(policy, 2, algo, placement, shard)
    assert two_ids == one_ids
    # rewards and the gradients' norms (before clipping: a sum over ranks taken as a mean would show here)
    assert np.ravel(two_observed) == pytest.approx(np.ravel(one_observed), rel=1e-10)
    assert min(norm for _, norm, _ in one_observed) > 0
    assert {d for role, d in devices if role == "actor"} == {"cpu0", "cpu1"}  # one device per rank in the records
    # the reward model: on the driver (the device after the ranks), or in its own worker
    assert ("reward", "cpu3" if placement == "disaggregated" else "cpu2") in devices
    for role in ("actor",) if algo == "grpo" else ("actor", "critic"):
        a, b = one_weights[role], two_weights[role]
        assert a.dtype == b.dtype == torch.float64
        assert float((a - b).abs().max()) <= 1e-10 * float(a.abs().max()), role
        assert not torch.equal(a, flat_weights_at_start(role)), "the run should have changed the weights"


def test_sharded_ranks_in_float32_stay_close_to_one():
    """The default dtype on CPU: FSDP2's collectives must be ones gloo has (a plain sum); float32 sums in another
    order than one batch, so rewards agree to 1e-4 only."""
    one, _, _, _ = run("oppo", 1, dtype="float32")
    two, _, _, _ = run("oppo", 2, shard=True, dtype="float32")
    assert np.ravel(two) == pytest.approx(np.ravel(one), rel=1e-4, abs=1e-4)


def flat_weights_at_start(role: str) -> torch.Tensor:
    roles = load_roles(ModelConfig(dtype="float64"), which=(role,))
    return torch.cat([v.flatten() for v in getattr(roles, role).state_dict().values()])


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"shard": True, "dp": 1}, "--shard needs --dp 2"),
        ({"shard": True, "dp": 4}, "at least --dp rows"),
        ({"dp": 0}, "dp must be > 0"),
    ],
)
def test_bad_data_parallel_settings_are_refused(changes, message):
    schedule = default_schedule(batch=4)  # minibatches of 2 rows
    with pytest.raises(ValueError, match=message):
        ExecConfig(schedule=schedule, **{"dp": 2} | changes)


def test_deal_balances_tokens_and_keeps_order():
    rows, tokens = torch.tensor([5, 2, 7, 1]), torch.tensor([10, 40, 20, 30])
    shares = deal(rows, tokens, 2)
    # longest first: 40 -> rank 0, 30 -> rank 1, 20 -> rank 1, 10 -> rank 0: 50 tokens each, in minibatch order
    assert [s.tolist() for s in shares] == [[5, 2], [7, 1]]
    assert sorted(torch.cat(shares).tolist()) == sorted(rows.tolist())
    assert [s.tolist() for s in deal(rows, tokens, 1)] == [rows.tolist()]
    assert [len(s) for s in deal(rows[:1], tokens[:1], 3)] == [1, 0, 0]  # a rank may get no row


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


TRAIN = [sys.executable, "-m", "oppo.exec.train", "--mode", "oppo", "--batch", "4", "--dp", "2"]


def rank_pids(stderr: str) -> list[int]:
    return [int(m.group(3)) for m in RANK_LINE.finditer(stderr)]


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
