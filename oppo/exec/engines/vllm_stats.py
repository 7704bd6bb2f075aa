"""The engine's own per-iteration counts, taken from vLLM's stat-logger interface (imports vLLM: loaded with the
engine only)."""

from __future__ import annotations

from vllm.v1.metrics.loggers import StatLoggerBase


class StatsLogger(StatLoggerBase):
    """Adds each engine iteration's scheduler counts to ``stats`` (an :class:`~oppo.exec.engines.vllm_engine.
    EngineStats`: the running batch, the tokens generated, preemptions and prefix-cache lookups)."""

    def __init__(self, vllm_config, engine_index: int = 0, stats=None) -> None:
        self.stats = stats

    @classmethod
    def factory(cls, stats):
        """What vLLM's ``stat_loggers`` takes: a callable of (config, engine index) making a logger on ``stats``."""
        return lambda vllm_config, engine_index=0: cls(vllm_config, engine_index, stats)

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        s = self.stats
        if scheduler_stats is not None:
            s.iterations += 1
            s.running += scheduler_stats.num_running_reqs
            prefix = scheduler_stats.prefix_cache_stats
            s.prefix_queries += prefix.queries
            s.prefix_hits += prefix.hits
        if iteration_stats is not None:
            s.generated += iteration_stats.num_generation_tokens
            s.preemptions += iteration_stats.num_preempted_reqs

    def log_engine_initialized(self) -> None:
        """Nothing to say: the run reports the engine in its summary."""
