import dataclasses
import gc
import json
import sys
import weakref
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from oppo.catalog.lengths import LengthTrace
from oppo.records.metrics import summarize
from oppo.sim import SimConfig, load_setup, simulate
from oppo.sim.cost.framework import TRL, Framework
from oppo.sim.setup.presets import Placement
from oppo.sim.workload import SeqLengths

GOLDEN = Path(__file__).with_name("golden_summary.json")


def small(policy="oppo", setup="tiny-cpu", steps=12, placement=None, **overrides):
    s = load_setup(setup)
    s = dataclasses.replace(s, placement=placement) if placement else s
    return SimConfig(s.schedule(policy=policy, **overrides), s, steps=steps, seed=3)


@dataclasses.dataclass(frozen=True)
class ConstantCost:
    """Each operation takes a fixed time: decode d per iteration, prefill p per pass, train t per pass."""

    d: float = 1.0
    p: float = 0.5
    t: float = 2.0

    def decode_s(self, batch, context_tokens):
        return np.full(np.shape(batch), self.d, dtype=float)

    def prefill_s(self, tokens, attended, rows=1):
        return self.p if tokens > 0 else 0.0

    score_s = prefill_s

    def train_s(self, tokens, attended, rows=1):
        return self.t

    def fixed_s(self, stages):
        return 0.0

    def update_host_s(self):
        return 0.0

    def sync_s(self):
        return 0.0


def test_sync_step_equals_hand_computed_phases():
    setup = dataclasses.replace(
        load_setup("tiny-cpu"), placement=Placement("disaggregated", 1, 1), ppo_epochs=1, minibatches=1
    )
    config = SimConfig(setup.schedule(policy="sync", batch=2), setup, steps=3)
    trace = LengthTrace("two", np.array([3, 5]), np.array([4, 4]))
    costs = {role: ConstantCost() for role in setup.devices}
    result = simulate(config, trace, costs=costs)
    by_step = defaultdict(list)
    for t in result.trained:
        by_step[t.step].append(t.response_tokens)
    for record in result.steps:
        longest = max(by_step[record.step])
        # prefill of the prompts; decode: one iteration per token of the longest; score: actor, reference,
        # critic passes in turn on the actor core while the reward core scores in parallel; train: actor then
        # critic (one epoch, one minibatch)
        expected = 0.5 + longest * 1.0 + 3 * 0.5 + 2 * 2.0
        assert record.step_s == pytest.approx(expected)


@pytest.mark.parametrize("policy", ["sync", "intra", "inter", "oppo", "tppo"])
def test_time_monotone_and_devices_not_double_booked(policy):
    result = simulate(small(policy, placement=Placement("disaggregated", 1, 1)))
    ends = [s.end_s for s in result.steps]
    assert all(b > a for a, b in zip(ends, ends[1:]))
    assert all(s.start_s == p.end_s for p, s in zip(result.steps, result.steps[1:]))
    rows = defaultdict(list)
    for r in result.trace:
        assert r.end_s >= r.start_s >= 0
        rows[r.device].append((r.start_s, r.end_s))
    for device, intervals in rows.items():  # disaggregated: one operation at a time per device
        intervals.sort()
        assert all(b[0] >= a[1] - 1e-9 for a, b in zip(intervals, intervals[1:])), device


def test_colocated_streaming_overlaps_on_one_device():
    setup = load_setup("paper-7b-h200")
    setup = dataclasses.replace(setup, placement=Placement(kind="colocated", actor_gpus=2, reward_gpus=0))
    result = simulate(SimConfig(setup.schedule(policy="intra", chunk="64", batch=8), setup, steps=3))
    assert {r.device for r in result.trace} == {"gpu0", "gpu1"}
    prefill = [r for r in result.trace if r.role == "reward" and r.phase == "prefill"]
    decode = [r for r in result.trace if r.phase == "decode" and r.device == prefill[0].device]
    overlapping = [p for p in prefill if any(d.start_s < p.end_s and p.start_s < d.end_s for d in decode)]
    assert overlapping  # the placement allows decode and prefill at once


@pytest.mark.parametrize("policy", ["oppo", "async"])
def test_a_finished_simulation_lets_go_of_its_records(policy):
    """SimPy's processes and events reference one another, so a finished simulation lives until the cyclic
    collector runs: its records must not live (and be scanned) with it, but go with their result."""
    gc.collect()
    gc.disable()
    try:
        result = simulate(small(policy, "paper-7b-h200", steps=3, batch=8))  # scorers of their own: processes left
        records, ops = weakref.ref(result), result.ops
        assert result.trained and ops
        del result
        assert records() is None, "the finished simulation still holds its result"  # reference counting alone
        assert sys.getrefcount(ops) == 2, gc.get_referrers(ops)  # ``ops`` and the call's argument: no device
    finally:
        gc.enable()


@pytest.mark.parametrize("policy", ["oppo", "async"])
def test_progress_is_told_each_step(policy):
    seen = []
    result = simulate(small(policy, steps=5), progress=seen.append)
    assert seen == result.steps and len(seen) == 5


def test_same_seed_same_records_other_seed_differs():
    a, b = simulate(small()), simulate(small())
    assert a.steps == b.steps and a.trace == b.trace and a.trained == b.trained
    c = simulate(dataclasses.replace(small(), seed=4))
    assert c.steps != a.steps


def test_overcommit_beats_sync_on_long_tail():
    sync = summarize("sync", *_records(simulate(small("sync", "paper-7b-h200", steps=20))), {}, 0)
    inter = summarize("inter", *_records(simulate(small("inter", "paper-7b-h200", steps=20))), {}, 0)
    assert inter["mean_step_s"] < 0.8 * sync["mean_step_s"]
    assert inter["mean_utilization"] > sync["mean_utilization"]


def _records(result):
    return result.steps, result.trace, result.trained


def test_chunk_prefiller_prefills_chunks_in_order_on_its_device():
    """The simulator's streamed scorer (not the executor's ``StreamingScorer``, a different thing: a name, one
    meaning): chunks queue in a SimPy store and are prefilled one after another, each on every GPU of its group."""
    import simpy

    import oppo.sim.model.trainer as model
    from oppo.sim.model.trainer import ChunkPrefiller, Device, SimResult

    assert not hasattr(model, "StreamingScorer")
    env, result = simpy.Environment(), SimResult()
    scorer = ChunkPrefiller(env, "reward", Device(env, "gpu6-7", result.ops), ConstantCost(p=0.5))
    scorer.submit(step=0, batch=4, tokens=64, context=0, attended=512.0)
    first = scorer.last
    scorer.submit(step=0, batch=4, tokens=64, context=256, attended=1e4)
    env.run(until=scorer.last)
    assert first.processed and env.now == 1.0
    log = [(r.device, r.role, r.phase, r.start_s, r.end_s, r.context_tokens) for r in result.trace]
    assert log == [
        ("gpu6", "reward", "prefill", 0.0, 0.5, 0),
        ("gpu7", "reward", "prefill", 0.0, 0.5, 0),
        ("gpu6", "reward", "prefill", 0.5, 1.0, 256),
        ("gpu7", "reward", "prefill", 0.5, 1.0, 256),
    ]


def test_golden_summary():
    """The committed summary of a small simulation on two devices, the actor's and the reward model's (streamed
    to), so that each device's busy fraction is a number of its own that can be wrong (on one device every
    operation runs back to back and utilisation is 1.0 whatever the model does). A missing golden file is a
    failure, never rewritten here (to update it after an intended change, write ``got`` by hand and review the
    diff)."""
    assert GOLDEN.is_file(), f"missing committed golden file {GOLDEN}"
    result = simulate(small("oppo", steps=30, placement=Placement("disaggregated", 1, 1)))
    summary = summarize("oppo", *_records(result), {}, 0.0)
    keys = (
        "mean_step_s",
        "p50_step_s",
        "p99_step_s",
        "total_s",
        "mean_utilization",
        "mean_deferrals",
        "mean_policy_lag",
        "final_reward",
    )
    got = {k: round(summary[k], 6) for k in keys}
    for table in ("utilization", "deferral_hist"):  # per device; per deferral count
        got[table] = {k: round(v, 6) for k, v in summary[table].items()}
    golden = json.loads(GOLDEN.read_text())
    assert got.keys() == golden.keys()
    for key in keys:  # one computation, same shapes: equal up to the 6-digit rounding of the file
        assert got[key] == pytest.approx(golden[key], rel=1e-6, abs=1e-6), key
    for table in ("utilization", "deferral_hist"):
        assert got[table].keys() == golden[table].keys(), table
        assert got[table] == pytest.approx(golden[table], abs=1e-6), table
    busy = sorted(golden["utilization"].values())
    assert len(busy) == 2 and 0 < busy[0] < busy[1] < 1  # the file itself holds no trivial utilisation


def test_toml_setup_overrides_and_errors(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('base = "paper-3b-a100"\nname = "mine"\n[placement]\nactor_gpus = 6\nreward_gpus = 2\n')
    setup = load_setup(str(path))
    assert setup.name == "mine" and setup.actor == "qwen2.5-3b"
    assert setup.devices["actor"] == "gpu0-5" and setup.devices["reward"] == "gpu6-7"
    path.write_text('[placement]\nkind = "ring"\n')
    with pytest.raises(ValueError, match="unknown placement"):
        load_setup(str(path))
    path.write_text("speed = 3\n")
    with pytest.raises(ValueError, match="unknown key 'speed'"):
        load_setup(str(path))


def test_length_drift_shortens_responses():
    from oppo.sim.workload import LengthModel, LengthSampler

    sampler = LengthSampler(LengthModel(drift_per_1k_steps=-0.5), 4096, np.random.default_rng(0))
    early = sampler.sample(0, 2000)[0].mean()
    late = sampler.sample(1000, 2000)[0].mean()
    assert late == pytest.approx(early * 0.5, rel=0.1)


@pytest.mark.parametrize("name", sorted(__import__("oppo.sim.setup.presets", fromlist=["PRESETS"]).PRESETS))
def test_every_preset_simulates(name):
    result = simulate(small("oppo", setup=name, steps=3))
    assert len(result.steps) == 3 and all(s.step_s > 0 for s in result.steps)


def test_framework_layer_base_in_a_setup_toml(tmp_path):
    """Paper presets carry TRL's layer and a TOML over them keeps it; ``[framework] base`` starts from another."""
    assert load_setup("paper-7b-h200").framework == TRL
    path = tmp_path / "bare.toml"
    path.write_text('base = "paper-7b-h200"\n[framework]\nbase = "roofline"\ntrain_micro_batch = 4\n')
    assert load_setup(str(path)).framework == dataclasses.replace(Framework(), train_micro_batch=4)
    path.write_text("[framework]\ntrain_micro_batch = 4\n")
    assert load_setup(str(path)).framework == dataclasses.replace(TRL, train_micro_batch=4)
    path.write_text('[framework]\nbase = "deepspeed"\n')
    with pytest.raises(ValueError, match="unknown .*base 'deepspeed'"):
        load_setup(str(path))


@pytest.mark.parametrize("policy", ["sync", "oppo", "tppo"])
def test_summary_columns_from_operations_equal_those_of_the_rows(policy):
    """A summary's columns are built from the recorded operations (a group's fields repeated per member); they
    must be exactly the columns of the per-GPU rows, on a placement whose devices hold several GPUs."""
    from oppo.records.metrics import Columns

    result = simulate(small(policy, steps=6, placement=Placement("disaggregated", 3, 2)))
    fast, rows = result.columns(), Columns.of(result.trace)
    assert len(result.trace) > len(result.ops) > 0  # groups of several GPUs: fewer operations than rows
    for field in ("step", "device", "stage", "start", "end", "tokens"):
        assert np.array_equal(getattr(fast, field), getattr(rows, field)), field
    assert (fast.devices, fast.stages) == (rows.devices, rows.stages)


def test_seq_lengths_grow_with_the_ids_and_refuse_non_integers():
    lengths = SeqLengths()
    lengths.add(np.arange(3), np.array([5, 6, 7]), np.array([1, 1, 2]))
    lengths.add(np.array([9, 4]), np.array([50, 40]), np.array([3, 4]))  # past the capacity: grows
    assert lengths.response.tolist()[:10] == [5, 6, 7, -1, 40, -1, -1, -1, -1, 50]  # never added: -1
    assert lengths.prompt[[9, 2]].tolist() == [3, 2]
    with pytest.raises(TypeError):
        lengths.add(np.array([10]), np.array([2.5]), np.array([1]))
