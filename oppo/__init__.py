"""oppo: pipeline overlap for PPO-based RLHF.

The package root is the scheduling core (stdlib, numpy, scipy): the rollout buffer, chunk-size policies, Δ
controllers, the per-step scheduler and the shared record schema. Backends: ``oppo.sim`` (SimPy model) and
``oppo.exec`` (torch executor).
"""

from oppo.config import POLICIES, ScheduleConfig
from oppo.records import StepRecord, TraceRow, TrainedSeq
from oppo.scheduler import Scheduler, StepOutcome, StepPlan

__version__ = "0.1.0"

__all__ = [
    "POLICIES",
    "ScheduleConfig",
    "Scheduler",
    "StepOutcome",
    "StepPlan",
    "StepRecord",
    "TraceRow",
    "TrainedSeq",
]
