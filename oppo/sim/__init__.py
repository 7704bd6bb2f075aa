"""oppo.sim: a SimPy model of PPO-RLHF steps driven by the scheduling core (see :func:`simulate`)."""

from oppo.sim.model.trainer import SimConfig, SimResult, simulate
from oppo.sim.setup.presets import PRESETS, Setup
from oppo.sim.setup.toml_file import load_setup

__all__ = ["PRESETS", "SimConfig", "SimResult", "Setup", "load_setup", "simulate"]
