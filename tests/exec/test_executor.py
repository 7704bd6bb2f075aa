"""The executor's policies against each other: same seed, same tokens; streamed scoring changes nothing."""

import dataclasses

import pytest
import torch

from oppo.exec.compute.timing import Recorder
from oppo.exec.config import ExecConfig, ModelConfig, default_schedule
from oppo.exec.models.roles import load_roles
from oppo.exec.step.runner import Executor


def run(policy, steps=4, dtype="float64", **schedule):
    config = ExecConfig(
        schedule=default_schedule(policy=policy, batch=4, max_new_tokens=24, **schedule),
        model=ModelConfig(dtype=dtype),
        steps=steps,
        seed=7,
    )
    torch.manual_seed(config.seed)
    executor = Executor.colocated(config, load_roles(config.model), Recorder())
    results = [executor.step() for _ in range(steps)]
    return executor, results


def weights(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("chunk", ["3", "8"])
def test_intra_equals_sync_in_float64(chunk):
    """Same sequences trained; rewards and final weights equal to 1e-12 relative (streamed prefill and one padded
    forward reduce in different orders, so the last bits may differ)."""
    sync, sync_steps = run("sync")
    intra, intra_steps = run("intra", chunk=chunk, streamed_scorers=("reward", "reference"))
    assert [[t.seq_id for t in o.trained] for o, _ in sync_steps] == [
        [t.seq_id for t in o.trained] for o, _ in intra_steps
    ]
    assert [m.mean_reward for _, m in intra_steps] == pytest.approx([m.mean_reward for _, m in sync_steps], rel=1e-12)
    for role in ("actor", "critic"):
        a, b = weights(getattr(sync.group.rank.roles, role)), weights(getattr(intra.group.rank.roles, role))
        assert a.dtype == b.dtype == torch.float64
        assert float((a - b).abs().max()) <= 1e-12 * float(a.abs().max()), role


def test_intra_close_to_sync_in_float32():
    _, sync_steps = run("sync", steps=2, dtype="float32")
    _, intra_steps = run("intra", steps=2, dtype="float32", chunk="5")
    for (_, a), (_, b) in zip(sync_steps, intra_steps):
        assert a.mean_reward == pytest.approx(b.mean_reward, abs=1e-4)


def test_a_sync_step_records_its_decode_in_rounds_that_span_its_contexts(monkeypatch):
    """One decode call per sync step, timed in rounds of at most RECORDED_ITERATIONS (3 here, for responses of
    up to 24 tokens): the trace a calibration fits sees the context grow within the step (one row per step could
    not tell per-context cost from per-iteration). Same tokens as one round: the rounds only split the timing."""
    from oppo.exec.compute import rollout

    whole, one_round = run("sync", steps=2)
    monkeypatch.setattr(rollout, "RECORDED_ITERATIONS", 3)  # 24-token responses: EOS inside rounds, 24 = 8 x 3
    executor, rounds = run("sync", steps=2)
    assert [m.mean_reward for _, m in rounds] == [m.mean_reward for _, m in one_round]
    for seq_id, data in whole.data.items():  # every token and its behaviour log-prob, bit for bit
        assert executor.data[seq_id].response == data.response
        assert executor.data[seq_id].behaviour_logprobs == data.behaviour_logprobs
    for step in (0, 1):
        rows = [r for r in executor.rec.rows if r.phase == "decode" and r.step == step]
        assert len(rows) >= 2 and all(r.num_tokens <= 3 * r.batch_size for r in rows), rows
        contexts = [r.context_tokens for r in rows]
        assert contexts == sorted(contexts) and contexts[0] < contexts[-1]


def test_overcommit_carries_and_trains_b():
    executor, steps = run("inter", steps=5, delta="2", check_tokens=2)
    for outcome, _ in steps:
        assert len(outcome.trained) == 4
        assert all(t.response_tokens <= 24 for t in outcome.trained)
    carried = [t for o, _ in steps for t in o.trained if t.deferrals > 0]
    assert carried, "with long-tailed lengths some sequences should be deferred"
    # a resumed sequence kept its tokens: its response is longer than what it decoded in its last step
    assert any(t.step_tokens < t.response_tokens for t in carried)


def test_tppo_segments_bounded_by_window():
    _, steps = run("tppo", steps=3, window_tokens=5)
    for outcome, _ in steps:
        assert all(t.step_tokens <= 5 for t in outcome.trained)
        assert len(outcome.trained) == 4


def test_same_seed_same_records():
    _, a = run("oppo", steps=3, dtype="float32")
    _, b = run("oppo", steps=3, dtype="float32")
    assert [dataclasses.astuple(m) for _, m in a] == [dataclasses.astuple(m) for _, m in b]
    assert [o.trained for o, _ in a] == [o.trained for o, _ in b]


def test_stored_config_roundtrips(tmp_path):
    from oppo.core.config import to_dict
    from oppo.exec.config import load_config
    from oppo.records.io import write_json

    config = ExecConfig(
        schedule=default_schedule(policy="oppo", chunk_candidates=(2, 4)),
        steps=3,
        seed=9,
        placement="disaggregated",
        remote_roles=("reward+reference", "critic"),
    )
    write_json(tmp_path / "config.json", to_dict(config) | {"sources": {}})
    assert load_config(tmp_path / "config.json") == config
    write_json(tmp_path / "config.json", to_dict(config) | {"speed": 3})  # another version's setting
    with pytest.raises(ValueError, match="unknown setting"):
        load_config(tmp_path / "config.json")


def test_grpo_trains_exactly_the_groups_the_core_selected(monkeypatch):
    from oppo.exec.step import runner

    seen = []
    original = runner.step_batch

    def spy(config, trained, data, scores, pad_id, eos_id):
        seen.append(([t.seq_id for t in trained], [data[t.seq_id].prompt for t in trained]))
        return original(config, trained, data, scores, pad_id, eos_id)

    monkeypatch.setattr(runner, "step_batch", spy)
    executor, steps = run("oppo", steps=4, dtype="float32", algo="grpo", group_size=3, delta="2", check_tokens=2)
    rank = executor.group.rank
    assert "critic" not in rank.scorers and rank.learner.critic_opt is None
    for (outcome, metrics), (ids, prompts) in zip(steps, seen):
        assert ids == [t.seq_id for t in outcome.trained]  # what the core selected, in its order
        groups = [t.group_id for t in outcome.trained]
        assert len(set(groups)) == 4 and all(groups.count(g) == 3 for g in groups)  # B = 4 whole groups
        for g in set(groups):  # the samples of a group answer one prompt
            assert len({tuple(p) for p, gid in zip(prompts, groups) if gid == g}) == 1
        assert metrics.value_loss == 0.0


@pytest.mark.slow
def test_grpo_learns():
    """python -m oppo.exec.train --algo grpo --group-size 4 --policy oppo --steps 100: the reward rises."""
    _, steps = run("oppo", steps=100, dtype="float32", algo="grpo", group_size=4)
    rewards = [m.mean_reward for _, m in steps]
    assert sum(rewards[-10:]) / 10 > sum(rewards[:10]) / 10 + 2.0


def test_a_sequence_samples_the_same_tokens_whatever_the_batch(monkeypatch):
    """sync decodes B sequences, inter B+Δ: a sequence both train (finished) has the same response, because
    sampling is keyed by sequence, not by the batch's random stream."""
    from oppo.exec.step import runner

    responses = {}
    original = runner.step_batch

    def spy(config, trained, data, scores, pad_id, eos_id):
        responses.setdefault(config.schedule.policy, {}).update(
            {t.seq_id: list(data[t.seq_id].response) for t in trained if t.finished}
        )
        return original(config, trained, data, scores, pad_id, eos_id)

    monkeypatch.setattr(runner, "step_batch", spy)
    run("sync", steps=1)
    run("inter", steps=1, delta="3", check_tokens=2)
    both = set(responses["sync"]) & set(responses["inter"])
    assert both  # the first B ids are in both batches; some finish in both
    assert all(responses["sync"][i] == responses["inter"][i] for i in both)
