"""The simulator's cost model, one layer per module, each importing only the layers above it in this list:

1. :mod:`oppo.sim.cost.gpu`: the GPU, its datasheet (:mod:`oppo.catalog.gpus`) and the fraction of it achieved
   (:class:`~oppo.sim.cost.gpu.Efficiency`, fitted to measured operator profiles).
2. :mod:`oppo.sim.cost.engine`: model shapes, generation engines, and the roofline seconds of a role's decode,
   prefill, scoring and training passes and weight sync (:class:`~oppo.sim.cost.engine.RooflineCost`).
3. :mod:`oppo.sim.cost.stage` and :mod:`oppo.sim.cost.framework`: what a real RL framework adds per stage
   (micro-batches, parameter gathers, offload, per-step costs): :meth:`~oppo.sim.cost.stage.StageCost.seconds`, the
   one formula the simulator charges and the fit fits, and the layer of a setup's stages and the loads its passes
   make.
4. :mod:`oppo.sim.cost.fit`: the fitted terms: the framework layer's terms fitted to logged stage seconds (the loads
   measured by :mod:`oppo.sim.logs.fit`).
5. :mod:`oppo.sim.cost.profile`: a whole cost model fitted to the executor's traces, in place of layers 2-4.

A setup (:mod:`oppo.sim.setup.presets`) assembles a cost model per role from these layers; the simulator
(:mod:`oppo.sim.model.trainer`) only calls it. None of them imports SimPy.
"""
