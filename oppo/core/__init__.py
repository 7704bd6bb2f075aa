"""The scheduling core: plain, deterministic Python (stdlib, numpy, scipy) that both backends drive.

- :mod:`~oppo.core.config`: :class:`ScheduleConfig`, the policy and its knobs;
- :mod:`~oppo.core.scheduler`: one step's plan and bookkeeping for every policy (the backends execute it);
- :mod:`~oppo.core.buffer`: the rollout buffer of B+Δ prompt groups, carrying unfinished ones across steps;
- :mod:`~oppo.core.chunking`: chunk-size policies for streaming to the scorers;
- :mod:`~oppo.core.overcommit`: Δ controllers (``slope``, ``alg1``, ``tail``, fixed);
- :mod:`~oppo.core.async_queue`: continuous admission with a staleness bound (``async``);
- :mod:`~oppo.core.staleness`: the mean policy lag of asynchronous RL in closed form.

Of the rest of oppo the core reads only the record schema (:mod:`oppo.records.schema`); it never imports a backend,
torch, SimPy or matplotlib (a ``lint-imports`` contract in ``pyproject.toml`` checks it). Time is an argument
(``now``), never read from a clock.
"""

from oppo.core.buffer import RolloutBuffer
from oppo.core.config import POLICIES, ScheduleConfig
from oppo.core.scheduler import Scheduler, StepOutcome, StepPlan

__all__ = ["POLICIES", "RolloutBuffer", "ScheduleConfig", "Scheduler", "StepOutcome", "StepPlan"]
