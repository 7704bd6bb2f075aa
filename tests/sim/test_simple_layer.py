"""The frozen simple layer (``oppo/sim/logs/simple.py``, ``docs/simulator.md``: a roofline with one efficiency per
pass kind, the host's time per micro-batch, a per-step constant for generation); the benchmark that compares it
with the full layer leave-one-group-out is smoked in ``tests/test_benchmarks.py``."""

import pytest

from oppo.sim.cost.stage import StageLoad
from oppo.sim.logs.simple import simple_terms


def test_the_simple_layer_divides_every_nominal_second_by_one_efficiency_and_sums():
    """Compute, gathers, serial collectives, host copies and the engine's moves at their nominal figures, all over
    the kind's efficiency, summed (no overlap, no micro-batch term), plus the host's time per unit and the per-step
    constant."""
    terms = simple_terms(inverse=2.0, per_unit_s=0.01, fixed_s=3.0)
    load = StageLoad(
        roofline_s=1.0,
        small_s=5.0,
        gather_s=0.5,
        serial_s=0.25,
        host_s=0.1,
        host_copy_s=0.2,
        units=10.0,
        steps=1.0,
        reshard_s=0.3,
        transfer_s=0.4,
        reshard_layers=28.0,
        reinit_steps=1.0,
    )
    nominal = 1.0 + 0.5 + 0.25 + 0.1 + 0.2 + 0.3 + 0.4
    assert terms.seconds(load) == pytest.approx(2.0 * nominal + 10 * 0.01 + 3.0, rel=1e-12)
