from oppo.sim.cli import entry

entry()
