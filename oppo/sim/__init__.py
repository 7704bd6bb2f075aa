"""oppo.sim: a SimPy model of PPO-RLHF steps driven by the scheduling core (see :func:`simulate`)."""

from oppo.sim.model import SimConfig, SimResult, simulate
from oppo.sim.setup_toml import load_setup
from oppo.sim.setups import PRESETS, Setup

__all__ = ["PRESETS", "SimConfig", "SimResult", "Setup", "load_setup", "simulate"]
