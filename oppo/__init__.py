"""oppo: pipeline overlap for PPO-based RLHF.

One scheduling core drives two backends:

- :mod:`oppo.core`: the scheduling core (stdlib, numpy, scipy): buffer, chunk-size policies, Δ controllers, the
  per-step scheduler;
- :mod:`oppo.records`: the record files both backends write, and how they are read, summarised and drawn;
- :mod:`oppo.catalog`: facts about the work (GPU datasheets, model shapes, response-length traces);
- :mod:`oppo.sim` (SimPy model) and :mod:`oppo.exec` (torch executor), which never import each other;
  :mod:`oppo.fidelity` joins them.

The names below are the core's public face: ``from oppo import Scheduler`` needs no backend.
"""

from oppo.core.config import POLICIES, ScheduleConfig
from oppo.core.scheduler import Scheduler, StepOutcome, StepPlan
from oppo.records.schema import StepRecord, TraceRow, TrainedSeq

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
