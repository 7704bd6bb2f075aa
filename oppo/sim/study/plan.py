"""The planner: which policy, chunk, Δ bound and controller, staleness K and rollout/train GPU split do the most
work per second under a staleness budget (``python -m oppo.sim plan``).

Search: every configuration of the space (:func:`candidates`) that fits the GPUs' memory (:func:`fits_memory`) is
simulated briefly; the better third goes on to longer runs over more seeds, twice (successive halving on steps and
seeds), so the long runs go to the promising region. ``sync`` and ``oppo`` with the setup's defaults always reach
the last rung: the gains are measured against them on equal terms. The objective is work per second (finished
trained samples, or their tokens, per second), never step time: a policy whose steps train partial responses
(T-PPO) gains nothing from short steps. ``--max-lag`` bounds the mean policy lag of trained samples. Everything is
deterministic for a seed, wherever the simulations run (:mod:`oppo.sim.study.pool`)."""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field

import numpy as np

from oppo.catalog.lengths import LengthTrace
from oppo.core.config import DELTA_CONTROLLERS, POLICIES, ScheduleConfig
from oppo.core.policies import PolicySpec, policy_spec
from oppo.sim.cost.engine import model_shape
from oppo.sim.model.trainer import SimConfig
from oppo.sim.setup.presets import Setup
from oppo.sim.study.experiments import config_dict, evaluate_sims, plain_value, run_config
from oppo.sim.study.journal import Journal
from oppo.sim.study.knobs import colocated_bytes, framework_grid, training_bytes, with_framework_knobs
from oppo.sim.study.pool import IN_PROCESS, Pool

OBJECTIVES = {"samples": "samples_per_s", "tokens": "tokens_per_s"}
LAG = "steady_policy_lag"  # what the planner ranks, bounds and reports as a configuration's lag (see steady_lag)
MEMORY_HEADROOM = 0.9  # activations, allocator fragmentation and the runtime's own share: 10% of the GPU
KNOBS = (
    "policy", "chunk", "delta_max", "delta_controller", "window_tokens", "staleness", "rollout_gpus",
    "rollout_tp", "memory_fraction", "micro_batch",
)  # fmt: skip


@dataclass(frozen=True)
class Candidate:
    """One point of the search space: a policy and the knobs it reads (the others stay at the setup's default)."""

    policy: str
    chunk: str | None = None  # intra, oppo: "auto" (online choice) or a fixed size
    delta_max: int | None = None  # over-commit policies: the Δ bound (prompts)
    delta_controller: str | None = None  # inter, oppo: how Δ moves within its bound
    window_tokens: int | None = None  # tppo
    staleness: int | None = None  # async: K
    rollout_gpus: int | None = None  # async: actor GPUs that generate only
    # --knobs framework (study.knobs): the rollout engine's tensor parallel degree and memory share, the update's
    # micro-batch (sequences per GPU; the scoring passes' scaled alike)
    rollout_tp: int | None = None
    memory_fraction: float | None = None
    micro_batch: int | None = None

    @property
    def label(self) -> str:
        parts = [self.policy] + [f"{k}={getattr(self, k)}" for k in KNOBS[1:] if getattr(self, k) is not None]
        return " ".join(parts)

    def schedule_overrides(self) -> dict:
        names = ("chunk", "delta_max", "delta_controller", "window_tokens", "staleness")
        return {"policy": self.policy} | {k: getattr(self, k) for k in names if getattr(self, k) is not None}

    def setup_for(self, setup: Setup) -> Setup:
        if self.rollout_gpus is not None:
            setup = dataclasses.replace(
                setup, placement=dataclasses.replace(setup.placement, rollout_gpus=self.rollout_gpus)
            )
        return with_framework_knobs(setup, self.rollout_tp, self.memory_fraction, self.micro_batch)


@dataclass
class Space:
    """What the planner may choose from (defaults: the whole space the simulator models)."""

    policies: tuple[str, ...] = POLICIES
    delta_fractions: tuple[float, ...] = (0.125, 0.25, 0.5, 1.0)  # Δ bounds as fractions of B
    controllers: tuple[str, ...] = DELTA_CONTROLLERS
    staleness: tuple[int, ...] = (1, 2, 4)
    window_factors: tuple[float, ...] = (0.5, 1.0, 2.0)  # T-PPO windows as multiples of the setup's
    framework: bool = False  # --knobs framework: also the rollout engine's and the trainer's knobs


def candidates(setup: Setup, space: Space) -> list[Candidate]:
    """Every configuration of ``space`` on ``setup``, in a fixed order."""
    batch = setup.batch
    chunks = ["auto", *map(str, setup.chunk_candidates)]
    bounds = sorted({max(1, min(batch, round(batch * f))) for f in space.delta_fractions})
    windows = sorted({max(1, round(setup.window_tokens * f)) for f in space.window_factors})
    tp = setup.framework.rollout_tensor_parallel  # a rollout split holds whole tensor-parallel engines
    splits = (
        [r for r in range(1, setup.placement.actor_gpus) if r % tp == 0] if setup.placement.actor_gpus > 1 else [None]
    )
    found = [
        c for p in space.policies for c in _policy_candidates(policy_spec(p), chunks, bounds, windows, splits, space)
    ]
    if not space.framework:
        return found
    return [dataclasses.replace(c, **knobs) for c in found for knobs in framework_grid(setup, c.rollout_gpus)]


def _policy_candidates(spec: PolicySpec, chunks, bounds, windows, splits, space: Space) -> list[Candidate]:
    """A policy's configurations, from what it switches on: the staleness bound and the rollout split of an
    asynchronous one, the window of a truncating one, the chunk of a streaming one, and over-commit's bound (with the
    Δ controller where Δ adapts)."""
    name = spec.name
    if spec.asynchronous:
        return [Candidate(name, staleness=k, rollout_gpus=r) for k in space.staleness for r in splits]
    if spec.truncated:
        return [Candidate(name, window_tokens=w) for w in windows]
    streamed = chunks if spec.streaming else [None]
    if not spec.overcommit:
        return [Candidate(name, chunk=c) for c in streamed]
    controllers = space.controllers if spec.adaptive_delta else [None]
    return [
        Candidate(name, chunk=c, delta_max=d, delta_controller=k) for c in streamed for d in bounds for k in controllers
    ]


def sim_config(setup: Setup, candidate: Candidate, schedule: dict, steps: int, seed: int) -> SimConfig:
    """The simulation of ``candidate`` on ``setup`` (``schedule``: the plan's own overrides, e.g. algo)."""
    placed = candidate.setup_for(setup)
    return SimConfig(placed.schedule(**schedule | candidate.schedule_overrides()), placed, steps, seed)


def memory_bytes(config: SimConfig) -> float:
    """A screening estimate of the busiest GPU's memory (bytes): trained models (actor, and critic for PPO) hold
    weights, gradients and Adam states over the training GPUs (:func:`.knobs.training_bytes`), the reference
    its weights; the generating GPUs hold the KV cache of every
    sequence in flight, (B + Δ) x G at prompt + cap tokens, and a rollout GPU a whole copy of the actor's weights."""
    setup, schedule = config.setup, config.schedule
    actor = model_shape(setup.actor)
    rollout = setup.placement.rollout_for(schedule.policy)
    train_gpus = setup.placement.actor_gpus - rollout
    roles = ["actor"] + (["critic"] if setup.critic and schedule.algo == "ppo" else [])
    training = training_bytes(setup, roles, train_gpus)
    in_flight = (schedule.batch + (schedule.delta_max if schedule.overcommit else 0)) * schedule.group_size
    kv = in_flight * (setup.lengths.prompt_tokens + schedule.max_new_tokens) * actor.kv_bytes_per_token
    generating = kv / rollout + actor.weight_bytes if rollout else training + kv / train_gpus
    if setup.framework.rollout_memory_fraction and not rollout:  # verl's hybrid engine: vLLM takes its share
        return colocated_bytes(setup, schedule, training)
    return max(training, generating)


def memory_budget(setup: Setup) -> float | None:
    """The bytes a GPU of ``setup`` may fill: its datasheet's (the catalog's or the setup's ``[gpu_spec]``) less the
    headroom."""
    return MEMORY_HEADROOM * setup.gpu_datasheet().memory_bytes


def fits_memory(config: SimConfig) -> bool:
    budget = memory_budget(config.setup)
    return budget is None or memory_bytes(config) <= budget


@dataclass
class Evaluated:
    candidate: Candidate
    steps: int
    summaries: list[dict] = field(default_factory=list)  # one per seed
    rung: int = 0  # the successive-halving rung it was last evaluated at (0: the first)
    searched: bool = True  # False: a baseline outside the searched policies, simulated for the gains only

    def values(self, key: str) -> list[float]:
        return [s[key] for s in self.summaries]

    def mean(self, key: str) -> float:
        return statistics.fmean(self.values(key))

    def spread(self, key: str) -> float:
        """Half the range over seeds (0 with one seed)."""
        values = self.values(key)
        return (max(values) - min(values)) / 2


@dataclass(frozen=True)
class Rungs:
    """Successive halving: the steps and seeds of each rung; ``keep`` of a rung's candidates go on."""

    steps: tuple[int, ...] = (40, 100, 200)
    seeds: tuple[int, ...] = (1, 2, 3)
    keep: float = 1 / 3

    def __post_init__(self) -> None:
        if len(self.steps) != len(self.seeds) or min(self.steps) < 1 or min(self.seeds) < 1:
            raise ValueError("each rung needs >= 1 step and >= 1 seed")


@dataclass
class Plan:
    evaluated: list[Evaluated]  # the last evaluation of every candidate that fitted
    skipped: list[Candidate]  # did not fit the GPUs' memory
    objective: str
    max_lag: float | None
    budget_used: int

    def final(self) -> list[Evaluated]:
        """The last rung's searched configurations (by rung, not by steps: rungs may simulate equal steps)."""
        last = self.last_rung
        return [e for e in self.evaluated if e.rung == last and e.searched]

    @property
    def last_rung(self) -> int:
        return max(e.rung for e in self.evaluated)

    def pareto(self) -> list[Evaluated]:
        """The last rung's configurations that no other beats on both work per second and mean lag."""
        key = OBJECTIVES[self.objective]
        rows = self.final()
        front = [
            e
            for e in rows
            if not any(
                o.mean(key) >= e.mean(key)
                and o.mean(LAG) <= e.mean(LAG)
                and (o.mean(key), o.mean(LAG)) != (e.mean(key), e.mean(LAG))
                for o in rows
            )
        ]
        return sorted(front, key=lambda e: e.mean(LAG))

    def best(self) -> tuple[Evaluated, bool]:
        """The best configuration under ``max_lag`` and whether any met it (else: the least lagging one)."""
        key = OBJECTIVES[self.objective]
        rows = self.final()
        feasible = [e for e in rows if self.max_lag is None or e.mean(LAG) <= self.max_lag]
        if feasible:
            return max(feasible, key=lambda e: e.mean(key)), True
        return min(rows, key=lambda e: (e.mean(LAG), -e.mean(key))), False

    def baseline(self, candidate: Candidate) -> Evaluated | None:
        """The last rung's evaluation of a baseline (None: it was skipped by the memory screen)."""
        last = self.last_rung
        return next((e for e in self.evaluated if e.candidate == candidate and e.rung == last), None)


def baselines(setup: Setup, schedule: dict) -> list[Candidate]:
    """``sync``, and ``oppo`` with the setup's defaults (chunk, Δ bound and controller) spelt out, so that the grid's
    equal point is the same candidate, simulated once."""
    default = setup.schedule(**schedule | {"policy": "oppo"})
    oppo = Candidate(
        "oppo", chunk=default.chunk, delta_max=default.delta_max, delta_controller=default.delta_controller
    )
    return [Candidate("sync"), oppo]


def plan(
    setup: Setup,
    space: Space = Space(),  # noqa: B008 (frozen defaults, never mutated)
    trace: LengthTrace | None = None,
    schedule: dict | None = None,
    objective: str = "samples",
    max_lag: float | None = None,
    budget: int = 400,
    seed: int = 0,
    rungs: Rungs = Rungs(),  # noqa: B008
    pool: Pool = IN_PROCESS,
    memory_screen: bool = True,
    journal: Journal | None = None,
) -> Plan:
    """Search ``space`` on ``setup`` within ``budget`` simulations (a simulation: one config, one seed);
    ``memory_screen`` False keeps configurations :func:`fits_memory` would skip (a run known to fit by means the
    estimate does not see). With a ``journal`` (``plan --out DIR``), each simulation's :data:`PLAN_KEYS` are
    recorded as it comes back and those it holds already are read back, not simulated: each rung decides from the
    same results, so a resumed plan takes the decisions of an uninterrupted one."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; choose from {', '.join(OBJECTIVES)}")
    schedule = schedule or {}
    valid, skipped = [], []
    searched = candidates(setup, space)
    for c in searched + [b for b in baselines(setup, schedule) if b not in searched]:
        try:
            config = sim_config(setup, c, schedule, 1, seed)
        except ValueError:
            continue  # a combination the policy refuses (e.g. T-PPO with groups): not in this space
        (valid if not memory_screen or fits_memory(config) else skipped).append(c)
    if not any(c in searched for c in valid):
        screened = [c for c in skipped if c in searched]
        if screened:
            least = min(memory_bytes(sim_config(setup, c, schedule, 1, seed)) for c in screened)
            raise ValueError(
                f"all {len(screened)} configurations were skipped by the memory screen (the least needs "
                f"{least / 1e9:.1f} GB of {memory_budget(setup) / 1e9:.1f} GB per GPU); --no-memory-screen plans anyway"
            )
        raise ValueError("empty search space: no configuration of the given policies can run this setup")
    fixed = [b for b in baselines(setup, schedule) if b in valid]
    alive = _within_budget(valid, fixed, any(b in searched for b in fixed), rungs, budget, np.random.default_rng(seed))
    evaluated: dict[Candidate, Evaluated] = {}
    used = 0
    for rung, (steps, seeds) in enumerate(zip(rungs.steps, rungs.seeds)):
        items = [(sim_config(setup, c, schedule, steps, s), trace) for c in alive for s in range(seed, seed + seeds)]
        desc = f"plan rung {rung + 1}/{len(rungs.steps)}"
        summaries = evaluate_sims(_summary if journal is None else _plan_point, items, pool, desc, journal, "plan")
        used += len(items)
        for i, c in enumerate(alive):
            evaluated[c] = Evaluated(c, steps, summaries[i * seeds : (i + 1) * seeds], rung, searched=c in searched)
        if rung + 1 < len(rungs.steps):
            alive = _promote(alive, evaluated, fixed, objective, max_lag, rungs.keep)
    return Plan(list(evaluated.values()), skipped, objective, max_lag, used)


def _summary(item) -> dict:
    """A simulation's summary (the planner reads summaries only: less to send back from a worker) and its
    :data:`LAG`."""
    config, trace = item
    run = run_config(config, trace)
    warm_up = config.schedule.staleness if config.schedule.asynchronous else 0
    return run.summary | {LAG: steady_lag(run.result.trained, config.steps, warm_up)}


# What the planner reads of a summary (ranking, bound, plan.csv, the gains): a journal records these alone.
PLAN_KEYS = (
    "samples_per_s", "tokens_per_s", "mean_policy_lag", LAG, "p99_policy_lag", "mean_step_s", "mean_utilization",
    "final_reward",
)  # fmt: skip


def _plan_point(item) -> dict:
    """:data:`PLAN_KEYS` of a simulation's :func:`_summary`, as plain values."""
    summary = _summary(item)
    return {key: plain_value(summary[key]) for key in PLAN_KEYS}


def steady_lag(trained, steps: int, warm_up: int = 0) -> float:
    """The mean policy lag of the samples trained in the second half of ``steps``, and after the first ``warm_up``
    steps (async K: the first K steps cannot be K behind) where those are more. Over a short early rung a run's mean
    lag understates the lag it settles at, and a configuration over ``--max-lag`` would pass that rung."""
    first = min(max(steps // 2, warm_up), steps - 1)
    if hasattr(trained, "column"):  # a run's records by column (TrainedColumns): no record built per sample
        step, lag = np.asarray(trained.column("step")), np.asarray(trained.column("policy_lag"))
        late = lag[step >= first]
        return float(late.mean()) if len(late) else 0.0
    late = [t.policy_lag for t in trained if t.step >= first]
    return float(np.mean(late)) if late else 0.0


def _within_budget(valid, baselines, a_baseline_searched: bool, rungs: Rungs, budget: int, rng) -> list[Candidate]:
    """The first rung's candidates: all of them if the whole halving fits ``budget``, else a seeded sample
    (baselines always in) of the largest size that does. A plan needs one searched configuration at least: the
    baselines alone (where the search holds neither) recommend nothing."""

    def cost(n: int) -> int:
        total, alive = 0, n
        for i, seeds in enumerate(rungs.seeds):
            total += alive * seeds
            if i + 1 < len(rungs.seeds):
                alive = _kept(alive, len(baselines), rungs.keep)
        return total

    n, least = len(valid), len(baselines) + (0 if a_baseline_searched else 1)
    while n > least and cost(n) > budget:
        n -= 1
    if cost(n) > budget:
        what = "the baselines alone" if a_baseline_searched else "the baselines and one searched configuration"
        raise ValueError(f"--budget {budget} is too small: {what} need {cost(n)} simulations")
    if n == len(valid):
        return valid
    others = [c for c in valid if c not in baselines]
    chosen = sorted(rng.choice(len(others), size=n - len(baselines), replace=False))
    return baselines + [others[i] for i in chosen]


def _kept(n: int, n_baselines: int, keep: float) -> int:
    """How many of ``n`` candidates (``n_baselines`` of them baselines) go on: ``keep`` of them, the baselines
    and at least one searched configuration among them, so the last rung always has one to recommend."""
    others = n - n_baselines
    return n_baselines + min(others, max(1, math.ceil(n * keep) - n_baselines))


def _promote(alive, evaluated, baselines, objective: str, max_lag: float | None, keep: float) -> list[Candidate]:
    """The baselines and the best of the others (configurations within ``max_lag`` first): ``keep`` of ``alive``
    in all, so that :func:`_within_budget` counts the rungs right."""
    key = OBJECTIVES[objective]

    def rank(c: Candidate) -> tuple:
        e = evaluated[c]
        over = max_lag is not None and e.mean(LAG) > max_lag
        return (over, -e.mean(key))

    others = sorted((c for c in alive if c not in baselines), key=rank)
    kept = set(others[: _kept(len(alive), len(baselines), keep) - len(baselines)])
    return [c for c in alive if c in kept or c in baselines]  # the original order: deterministic


def plan_rows(result: Plan) -> list[dict]:
    """``plan.csv``: every evaluated configuration with its knobs and summary (means and spreads over seeds)."""
    key = OBJECTIVES[result.objective]
    front = {id(e) for e in result.pareto()}
    rows = []
    for e in sorted(result.evaluated, key=lambda e: (-e.rung, -e.steps, -e.mean(key))):
        c = e.candidate
        rows.append(
            {k: getattr(c, k) for k in KNOBS}
            | {
                "rung": e.rung + 1,
                "steps": e.steps,
                "seeds": len(e.summaries),
                "samples_per_s": round(e.mean("samples_per_s"), 4),
                "samples_per_s_spread": round(e.spread("samples_per_s"), 4),
                "tokens_per_s": round(e.mean("tokens_per_s"), 2),
                "mean_lag": round(e.mean("mean_policy_lag"), 4),
                "steady_lag": round(e.mean(LAG), 4),
                "p99_lag": round(e.mean("p99_policy_lag"), 4),
                "mean_step_s": round(e.mean("mean_step_s"), 3),
                "mean_util": round(e.mean("mean_utilization"), 4),
                "final_reward": round(e.mean("final_reward"), 4),
                "searched": e.searched,
                "within_max_lag": result.max_lag is None or e.mean(LAG) <= result.max_lag,
                "pareto": id(e) in front,
            }
        )
    return rows


@dataclass(frozen=True)
class Confirmed:
    """The best configuration's gain over a baseline on seeds the search never simulated (its winner was chosen on
    the search's seeds, where its gain is flattered by that choice): per fresh seed, the ratio of the objective."""

    baseline: Candidate
    ratios: tuple[float, ...]  # best / baseline on each fresh seed, paired (same seed, same lengths)

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)


def fresh_seeds(seed: int, rungs: Rungs, n: int) -> list[int]:
    """``n`` seeds after every seed a rung simulated (rung r simulates ``seed .. seed + rungs.seeds[r] - 1``)."""
    first = seed + max(rungs.seeds)
    return list(range(first, first + n))


def confirm(
    result: Plan,
    setup: Setup,
    trace: LengthTrace | None,
    schedule: dict,
    seeds: list[int],
    pool: Pool = IN_PROCESS,
    journal: Journal | None = None,
) -> list[Confirmed]:
    """Re-simulate the best configuration and each baseline the search ran to its last rung on ``seeds``, at the
    last rung's steps; the per-seed gains over each baseline (through ``journal`` as :func:`plan`)."""
    best, _ = result.best()
    others = [b.candidate for b in map(result.baseline, baselines(setup, schedule)) if b is not None]
    others = [c for c in others if c != best.candidate]
    if not others:  # the best is the only baseline that ran: nothing to compare it with
        return []
    runs = [best.candidate, *others]
    items = [(sim_config(setup, c, schedule, best.steps, s), trace) for c in runs for s in seeds]
    key = OBJECTIVES[result.objective]
    fn = _summary if journal is None else _plan_point
    values = [s[key] for s in evaluate_sims(fn, items, pool, "fresh seeds", journal, "plan")]
    per_run = [values[i * len(seeds) : (i + 1) * len(seeds)] for i in range(len(runs))]
    return [Confirmed(c, tuple(b / o for b, o in zip(per_run[0], v))) for c, v in zip(others, per_run[1:])]


def best_config(result: Plan, setup: Setup, trace: LengthTrace | None, schedule: dict, seed: int) -> dict:
    """The best configuration as ``run --config`` reads it (its last rung's steps, the plan's first seed)."""
    best, _ = result.best()
    return config_dict(sim_config(setup, best.candidate, schedule, best.steps, seed), trace)


def exec_flags(schedule: ScheduleConfig) -> list[str]:
    """The ``python -m oppo.exec.train`` options that run ``schedule`` (every field spelt out: the executor's own
    defaults differ from a setup's)."""
    values = dataclasses.asdict(schedule)
    flags = ["--policy", values.pop("policy")]
    for name, value in values.items():
        text = ",".join(map(str, value)) if isinstance(value, tuple | list) else str(value)
        flags += [f"--{name.replace('_', '-')}", text]
    return flags
