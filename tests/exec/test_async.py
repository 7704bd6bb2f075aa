"""``--policy async --staleness K`` in one process: generation with the weights of K versions ago (no overlap)."""

from types import SimpleNamespace

import pytest
import torch

from oppo.exec.compute.timing import Recorder
from oppo.exec.config import ExecConfig, ModelConfig, PPOConfig, default_schedule
from oppo.exec.models.roles import load_roles
from oppo.exec.step import snapshot
from oppo.exec.step.runner import Executor
from tests import invoke


def executor_for(policy, staleness=1, offpolicy="none"):
    config = ExecConfig(
        schedule=default_schedule(policy=policy, batch=4, max_new_tokens=24, staleness=staleness),
        model=ModelConfig(dtype="float64"),
        ppo=PPOConfig(offpolicy=offpolicy),
        seed=13,
    )
    torch.manual_seed(config.seed)
    return Executor.colocated(config, load_roles(config.model), Recorder())


def run(policy, steps=5, **kwargs):
    executor = executor_for(policy, **kwargs)
    return executor, [executor.step() for _ in range(steps)]


def actor_weights(executor):
    return torch.cat([p.detach().flatten() for p in executor.group.rank.roles.actor.parameters()])


def test_staleness_0_is_sync():
    sync, sync_steps = run("sync")
    stale, stale_steps = run("async", staleness=0)
    assert [[t.seq_id for t in o.trained] for o, _ in stale_steps] == [
        [t.seq_id for t in o.trained] for o, _ in sync_steps
    ]
    assert [m.mean_reward for _, m in stale_steps] == [m.mean_reward for _, m in sync_steps]
    assert torch.equal(actor_weights(sync), actor_weights(stale))  # the same operations: bit for bit


def test_generation_runs_k_versions_behind_and_its_samples_say_so():
    executor, steps = run("async", staleness=2)
    lags = [[t.policy_lag for t in outcome.trained] for outcome, _ in steps]
    assert lags == [[0] * 4, [1] * 4, [2] * 4, [2] * 4, [2] * 4]
    assert executor.history.generating_version == 3 and len(executor.history.versions) == 3
    # after the step the actor holds the newest weights, not the generating version's
    newest = executor.history.versions[-1]
    assert all(torch.equal(v, newest[k]) for k, v in executor.group.rank.roles.actor.state_dict().items())


def test_stale_samples_carry_their_behaviour_log_probs_and_decoupled_ppo_uses_them():
    none, _ = run("async", staleness=2)
    decoupled, _ = run("async", staleness=2, offpolicy="decoupled")
    on_policy, _ = run("async", staleness=0, offpolicy="decoupled")
    sync, _ = run("sync")
    assert float((actor_weights(none) - actor_weights(decoupled)).abs().max()) > 1e-6  # stale tokens reweighted
    a, b = actor_weights(sync), actor_weights(on_policy)
    assert float((a - b).abs().max()) <= 1e-9 * float(a.abs().max())  # K = 0: every weight is 1 (to 1e-9)


def test_an_async_run_resumes_with_its_recent_versions(tmp_path):
    straight, steps = run("async", steps=6, staleness=2)
    first = executor_for("async", staleness=2)
    done = [first.step() for _ in range(3)]
    log = SimpleNamespace(
        steps=[o.record for o, _ in done], trained=[], metrics=[m for _, m in done], held_out_start=None
    )
    snapshot.save(tmp_path, first, log, first.rec)
    resumed = executor_for("async", staleness=2)
    log2 = SimpleNamespace(steps=[], trained=[], metrics=[], held_out_start=None)
    assert snapshot.restore(snapshot.latest(tmp_path), resumed, log2, resumed.rec) == 3
    rest = [resumed.step() for _ in range(3)]
    assert [m.mean_reward for _, m in done + rest] == pytest.approx([m.mean_reward for _, m in steps], rel=1e-12)
    a, b = actor_weights(straight), actor_weights(resumed)
    assert float((a - b).abs().max()) <= 1e-10 * float(a.abs().max())


@pytest.mark.parametrize(
    "args, message",
    [
        (("--policy", "async", "--staleness", "-1"), "staleness must be >= 0"),
        (("--policy", "async", "--dp", "2"), "async trains in one process"),
    ],
)
def test_bad_async_settings_exit_2(tmp_path, args, message):
    res = invoke.train(*args, "--steps", "1", "--out", tmp_path / "x")
    assert res.returncode == 2 and message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
