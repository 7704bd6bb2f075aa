"""oppo.sim: a SimPy model of PPO-RLHF steps driven by the scheduling core (see :func:`simulate`)."""

from oppo.sim.model import SimConfig, SimResult, simulate
from oppo.sim.setups import PRESETS, Setup, load_setup

__all__ = ["PRESETS", "SimConfig", "SimResult", "Setup", "load_setup", "simulate"]
