"""Studies over many simulations: policies side by side and sweeps (:mod:`.experiments`), the planner and its knobs, and
the worker pool that spreads them over processes or a Ray cluster.
"""
