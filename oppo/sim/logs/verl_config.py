"""A verl run's configuration, read from its console log.

verl's console log starts with the launch command (a shell trace ``+ python3 -m verl.trainer.main_ppo KEY=VALUE
...``, or a ``command:`` block whose quoted argument holds the overrides) and, once the trainer starts, the
resolved configuration printed as a Python dict (``pprint`` of the OmegaConf tree, one Ray-prefixed line per entry).
Both become one flat table of dotted keys (``actor_rollout_ref.rollout.n``). The printed configuration is the
resolved one, so it wins; the command's overrides fill what it lacks (a printout cut short by other processes'
output, or a log whose printout was left out). Keys in neither are verl's defaults, which the reader of this table
supplies and says so.
"""

from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oppo.sim.logs.read import read_log_text
from oppo.sim.setup.presets import Setup

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
RAY_PREFIX = re.compile(r"^\s*(\([^()]*pid=\d+[^()]*\))\s?")  # "(main_task pid=54569) ", "(TaskRunner pid=1) "
# verl's trainers: verl.trainer.main_ppo, and the asynchronous ones (verl.experimental.one_step_off_policy.main_ppo,
# verl.experimental.fully_async_policy.fully_async_main; recipe.* in 2025)
LAUNCH = re.compile(r"\bpython3?\s+-m\s+((?:verl|recipe)\.[\w.]*main\w*)(\s.*|)$")
OVERRIDE = re.compile(r"^\+{0,2}([A-Za-z_][\w.]*)=(.*)$", re.S)  # Hydra: key=value, +key=value, ++key=value
CONFIG_NAME = re.compile(r"^(?:--config-name|-cn)=(\S+)$")
VLLM_VERSION = re.compile(r"\bvllm(?:==|-| version |: )v?(\d+\.\d+)", re.I)  # "vllm==0.8.3", "vLLM version 0.6.3"
# a vLLM V1 engine's own modules in the log's output ("vllm.v1.worker.gpu_worker.Worker", ".../vllm/v1/engine/...")
# or its start-up line ("Initializing a V1 LLM engine"): vLLM's V1 scheduler ran
VLLM_V1 = re.compile(r"\bvllm[./]v1[./]|\bV1 LLM engine\b")
DATE = re.compile(r"\b(20\d\d-[01]\d-[0-3]\d)[ T][0-2]\d:[0-5]\d")
ARA = "actor_rollout_ref"  # the actor, rollout and reference worker's configuration
TOP_LEVEL = ("actor_rollout_ref", "algorithm", "data", "trainer", "critic", "reward_model")
_MISSING = object()


@dataclass(frozen=True)
class VerlConfig:
    """A run's configuration as its log shows it."""

    source: str  # the log
    values: dict[str, Any]  # dotted key -> value
    origin: dict[str, str]  # dotted key -> "config" (the printed configuration) or "command" (an override)
    entry: str | None  # the trainer module launched (verl.trainer.main_ppo), if the command is in the log
    config_name: str | None  # the command's --config-name (e.g. ppo_megatron_trainer.yaml), if any
    printed: bool  # the log prints the resolved configuration
    truncated: bool  # ... cut short: the keys after the cut come from the command or verl's defaults
    date: str | None  # the first timestamp in the log (YYYY-MM-DD): which verl / vLLM generation ran
    vllm: tuple[int, int] | None = None  # the vLLM version the log prints, if any
    vllm_v1: bool = False  # the log shows a vLLM V1 engine at work (VLLM_V1)

    def get(self, key: str, default: Any = _MISSING) -> Any:
        """The value of ``key``; ``default`` where the log does not say (KeyError without one)."""
        if key in self.values:
            return self.values[key]
        if default is _MISSING:
            raise KeyError(key)
        return default

    def has(self, key: str) -> bool:
        return key in self.values


def read_verl_config(path: str | Path) -> VerlConfig | None:
    """The configuration a verl console log shows, or None where it shows neither a launch command nor a printed
    configuration (a per-step CSV, an OpenRLHF log, a log of step lines only)."""
    path = Path(path)
    if path.name.removesuffix(".gz").endswith((".csv", ".jsonl", ".json")):
        return None
    lines = [ANSI.sub("", line) for line in read_log_text(path).splitlines()]
    command, entry, config_name = _command(lines)
    printed, truncated = _printed_config(lines)
    if not command and printed is None:
        return None
    values = dict(command)
    origin = dict.fromkeys(command, "command")
    flat = dict(_flatten(printed or {}))
    values |= flat
    origin |= dict.fromkeys(flat, "config")
    date = next((m.group(1) for line in lines if (m := DATE.search(line))), None)
    version = next((m.group(1) for line in lines if (m := VLLM_VERSION.search(line))), None)
    vllm = tuple(int(x) for x in version.split(".")) if version else None
    v1 = any(VLLM_V1.search(line) for line in lines)
    return VerlConfig(str(path), values, origin, entry, config_name, printed is not None, truncated, date, vllm, v1)


def _command(lines: list[str]) -> tuple[dict[str, Any], str | None, str | None]:
    """The overrides of the first ``python -m verl.trainer.main_*`` line (a later one may be a relaunch), else
    those of a ``command:`` block (the verl examples' logs of 2024: ``bash run.sh "KEY=VALUE ..."``)."""
    for line in lines:
        match = LAUNCH.search(line)
        if match:
            overrides, config_name = _overrides(match.group(2))
            return overrides, match.group(1), config_name
    for i, line in enumerate(lines[:-1]):
        if line.strip() == "command:":
            body = next((nxt for nxt in lines[i + 1 :] if nxt.strip()), "")
            return _overrides(body)[0], None, None
    return {}, None, None


def _overrides(text: str) -> tuple[dict[str, Any], str | None]:
    """``key=value`` words of a shell command line (a quoted word holding several is split again), later ones
    winning as in Hydra; and ``--config-name``."""
    try:
        words = shlex.split(text)
    except ValueError:  # an unbalanced quote: the line was cut short
        words = text.split()
    overrides: dict[str, Any] = {}
    config_name = None
    for i, word in enumerate(words):
        match = CONFIG_NAME.match(word)
        if match or word in ("--config-name", "-cn"):
            config_name = match.group(1) if match else (words[i + 1] if i + 1 < len(words) else None)
            continue
        if word.startswith(("-", "~")):  # another option, or a Hydra deletion (~key): no value set
            continue
        pieces = word.split()  # a quoted word of several overrides, or one override whose value has spaces
        parts = pieces if all(OVERRIDE.match(p) for p in pieces) else [word]
        for part in parts:
            kv = OVERRIDE.match(part)
            if kv:
                overrides[kv.group(1)] = parse_value(kv.group(2))
    return overrides, config_name


def parse_value(text: str) -> Any:
    """A Hydra override's value: a number, a boolean, null, a list, else the string."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "none", "~"):
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        pass
    if text.startswith("[") and text.endswith("]"):  # [console,wandb]: Hydra's unquoted list
        return [parse_value(item) for item in text[1:-1].split(",") if item.strip()]
    return text


def _printed_config(lines: list[str]) -> tuple[dict | None, bool]:
    """The configuration verl prints at start (a Python dict over several lines of one Ray process), and whether
    it was cut short: other processes' output may land inside it, and a line of its own that is not a
    continuation (pprint indents those) ends it."""
    start = next((i for i, line in enumerate(lines) if _opens_config(_split_prefix(line)[1])), None)
    if start is None:
        return None, False
    prefix, body = _split_prefix(lines[start])
    block = [body]
    depth = _depth(body)
    for line in lines[start + 1 :]:
        if depth <= 0:
            break
        other, text = _split_prefix(line)
        if other != prefix:
            continue  # another process's output, interleaved
        if not text.startswith(" "):
            break  # the process printed something else: the configuration was cut short
        block.append(text)
        depth = _depth("\n".join(block))
    return _literal_prefix(block)


def _opens_config(body: str) -> bool:
    return body.startswith("{'") and any(f"'{key}'" in body for key in TOP_LEVEL)


def _split_prefix(line: str) -> tuple[str | None, str]:
    match = RAY_PREFIX.match(line)
    return (match.group(1), line[match.end() :]) if match else (None, line)


def _depth(text: str) -> int:
    """Brackets left open in ``text``, strings skipped."""
    return len(_open_brackets(text) or [])


def _open_brackets(text: str) -> list[str] | None:
    """The stack of brackets open at the end of ``text`` (None: inside a string, or a closing bracket unmatched)."""
    stack: list[str] = []
    quote = None
    escaped = False
    for ch in text:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in "{[(":
            stack.append(ch)
        elif ch in "}])":
            if not stack or "{[(".index(stack[-1]) != "}])".index(ch):
                return None
            stack.pop()
    return None if quote else stack


CLOSE = {"{": "}", "[": "]", "(": ")"}


def _literal_prefix(block: list[str]) -> tuple[dict | None, bool]:
    """The dict of the longest run of whole lines from the start of ``block`` that parses once its open brackets
    are closed (every entry of a pprint line ends with a comma or a bracket); whether lines were dropped or
    brackets closed."""
    for end in range(len(block), 0, -1):
        text = "\n".join(block[:end]).rstrip().removesuffix(",")
        stack = _open_brackets(text)
        if stack is None:
            continue
        try:
            value = ast.literal_eval(text + "".join(CLOSE[b] for b in reversed(stack)))
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        if isinstance(value, dict):
            return value, bool(stack) or end < len(block)
    return None, False


def _flatten(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def fully_async(config: VerlConfig) -> bool:
    """Whether the log is verl's fully async trainer's: its launch command, or where the log prints only the
    configuration, a batch of 0 with the trainer's sync period set."""
    if "fully_async" in (config.entry or ""):
        return True
    return config.get("data.train_batch_size", None) == 0 and config.get(SYNC_PERIOD, None) is not None


SYNC_PERIOD = "async_training.trigger_parameter_sync_step"
REQUIRE_BATCHES = "async_training.require_batches"


# setup fields a log's own configuration fixes: a --setup that disagrees describes another run
CHECKED = (  # (the setup's key, the log's, the setup's value as the log's key has it: None, the setup does not say)
    ("group_size", f"{ARA}.rollout.n", lambda s: s.group_size),
    ("batch", "data.train_batch_size", lambda s: s.batch),
    ("max_new_tokens", "data.max_response_length", lambda s: s.max_new_tokens),
    (
        "rollout_tensor_parallel",
        f"{ARA}.rollout.tensor_model_parallel_size",
        lambda s: s.framework.rollout_tensor_parallel,
    ),
    (  # the rollout engine's version, where the setup states it
        "decode_cuda_graphs (as enforce_eager)",
        f"{ARA}.rollout.enforce_eager",
        lambda s: None if "decode_cuda_graphs" in s.framework.engine_unstated else not s.framework.decode_cuda_graphs,
    ),
    (
        "chunked_prefill (as enable_chunked_prefill)",
        f"{ARA}.rollout.enable_chunked_prefill",
        lambda s: {"on": True, "off": False}.get(s.framework.chunked_prefill),
    ),
    (
        "max_num_batched_tokens",
        f"{ARA}.rollout.max_num_batched_tokens",
        lambda s: s.framework.max_num_batched_tokens or None,
    ),
)


def contradictions(setup: Setup, path: str | Path) -> str:
    """How ``setup`` contradicts the configuration the log at ``path`` shows ("" where it does not, or the log
    shows none)."""
    config = read_verl_config(path)
    if config is None:
        return ""
    for name, key, value_of in CHECKED:
        logged = config.get(key, None)
        if key == "data.train_batch_size" and fully_async(config):  # 0: a trainer step's batch is its mini-batches
            key = "actor.ppo_mini_batch_size x async_training.require_batches"
            logged = config.get(f"{ARA}.actor.ppo_mini_batch_size", 256) * config.get(REQUIRE_BATCHES, 1)
        if logged is not None and value_of(setup) is not None and value_of(setup) != logged:
            return f"its {name} is {value_of(setup)}, the log's {key} is {logged}"
    if config.vllm_v1 and setup.framework.rollout_scheduler == "v0":
        return "its rollout_scheduler is 'v0', the log shows a vLLM V1 engine at work"
    return ""
