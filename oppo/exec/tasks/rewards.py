"""Verifiable (rule-based) rewards for RL on language models, with verl's calling convention.

verl scores a response with a plain function called by keyword, one sample at a time (its reward managers, e.g.
``verl/workers/reward_manager/naive.py``, make the call; ``verl/trainer/ppo/reward.py`` loads a user's function from
``custom_reward_function.path`` / ``.name``, the name defaulting to ``compute_score``)::

    compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None)
        -> float | dict   # a dict carries the reward under "score"; its other keys are extra metrics

Any such function works here: :func:`load_reward_fn` takes a built-in name or ``PATH.py:FUNCTION`` and
:func:`score_value` turns either result form into the float a trainer needs. The built-ins ignore ``data_source``
(verl's ``default_compute_score`` in ``verl/utils/reward_score/__init__.py`` dispatches on it; here the spec picks
the function):

- ``gsm8k``: verl's ``verl/utils/reward_score/gsm8k.py`` extraction, rewritten, its quirks included (see
  :func:`extract_gsm8k_answer`); 1.0 for a correct answer, else 0.0 (verl's ``format_score`` default).
- ``math``: the last ``\\boxed{...}`` compared after the Hendrycks MATH string normalisation that
  ``verl/utils/reward_score/math.py`` uses (``is_equiv`` / ``strip_string``), reimplemented with small deviations
  listed at :func:`normalize_math_answer`.
- ``format``: a shaping reward for writing a final answer at all (``#### N`` or a boxed answer). It never says
  whether the answer is right, so it must never be reported as accuracy.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import re
import sys
from collections.abc import Callable, Mapping
from numbers import Real
from pathlib import Path
from typing import Any

RewardResult = float | Mapping[str, Any]
RewardFn = Callable[..., RewardResult]

# -- result normalisation ----------------------------------------------------------------------------------------


def score_value(result: object) -> float:
    """The reward as a float: ``result`` itself when it is a number, ``result["score"]`` when it is a mapping.

    Raises ``ValueError`` (one line) for anything else, a mapping without ``"score"``, or a non-finite score: a NaN
    reward would silently poison every advantage of its group.
    """
    if isinstance(result, Mapping):
        if "score" not in result:
            shown = (str(k) if str(k).isprintable() else repr(k) for k in result)  # a line break in a key: one line
            raise ValueError(f"a reward dict must carry a 'score' key (its keys: {', '.join(shown) or 'none'})")
        result = result["score"]
    if not isinstance(result, Real):
        raise ValueError(f"a reward must be a number or a dict with a 'score' number, got {type(result).__name__}")
    return finite(result, "a reward")


def finite(value: Any, what: str) -> float:
    """``value`` as a float, or ValueError naming ``what``: NaN, an infinity or a number too large for a float (a
    huge integer or fraction) is no reward."""
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"{what} must be finite, got a number too large for a float") from None
    if not math.isfinite(number):
        raise ValueError(f"{what} must be finite, got {number}")
    return number


# -- gsm8k -------------------------------------------------------------------------------------------------------

GSM8K_METHODS = ("strict", "flexible")
# verl reads only the end of a response: regexes over long texts are slow and the final answer sits at the end.
GSM8K_CLIP_CHARS = 300
_GSM8K_MARKED = re.compile(r"#### (-?[0-9.,]+)")
_GSM8K_NUMBERISH = re.compile(r"-?[0-9.,]+")


def extract_gsm8k_answer(solution_str: str, method: str = "strict") -> str | None:
    """The answer verl's gsm8k scorer reads from the last ``GSM8K_CLIP_CHARS`` characters, or None.

    ``strict``: the last ``#### N`` (exactly one space after the hashes; N digits, ".", "," with an optional "-"),
    commas removed. A "$" cannot follow "#### " (the pattern would not match), so ``#### $18`` has no answer.
    ``flexible``: the last run of digits/"."/"," that is not a lone ".", returned as written: verl strips nothing
    here, so ``1,000`` or a sentence-final ``42.`` do not equal ``1000`` / ``42``.
    """
    if method not in GSM8K_METHODS:
        raise ValueError(f"unknown gsm8k method {method!r}; choose from {', '.join(GSM8K_METHODS)}")
    tail = solution_str[-GSM8K_CLIP_CHARS:]
    if method == "strict":
        marked = _GSM8K_MARKED.findall(tail)
        return marked[-1].replace(",", "").replace("$", "") if marked else None
    # verl falls back to a lone "." when nothing else is there; None scores the same against any numeric truth
    return next((run for run in reversed(_GSM8K_NUMBERISH.findall(tail)) if run != "."), None)


def gsm8k_reward(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 when the extracted answer equals ``ground_truth`` as a string (verl's data keeps it a bare number without
    commas), else 0.0. ``extra_info={"method": "flexible"}`` picks the method (default strict)."""
    method = (extra_info or {}).get("method", "strict")
    answer = extract_gsm8k_answer(solution_str, method)
    return 1.0 if answer is not None and answer == str(ground_truth) else 0.0


# -- math (boxed answers) ----------------------------------------------------------------------------------------

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def _balanced_group(text: str, start: int) -> tuple[str, int] | None:
    """The content of the brace group opening at ``text[start] == "{"`` and the index after its closing brace."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
    return None  # unclosed: a truncated answer


def last_boxed_content(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces) or ``\\boxed X`` (up to "$" or
    the end of the line), or None when there is none or the last one is unclosed.

    Unlike verl, whose ``last_boxed_only_string`` prefers any ``\\boxed `` form over a later ``\\boxed{}`` and reads
    ``\\fbox`` only when no ``\\boxed`` exists, the last box of either kind wins.
    """
    start = max(text.rfind(command) for command in _BOX_COMMANDS)
    if start < 0:
        return None
    command = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    after = start + len(command)
    if text.startswith("{", after):
        group = _balanced_group(text, after)
        return group[0] if group else None
    if command == "\\boxed" and text.startswith(" ", after):
        return re.split(r"[$\n]", text[after + 1 :], maxsplit=1)[0].strip()
    return None  # e.g. "\boxed" at the very end, or another command that merely starts with the same letters


def _frac_argument(text: str, start: int) -> tuple[str, int] | None:
    """One ``\\frac`` argument at ``start``: a brace group or a single character (``\\frac12``)."""
    if start >= len(text) or text[start] in "\\}":
        return None  # a command argument such as \frac\pi2 is left as written
    if text[start] == "{":
        return _balanced_group(text, start)
    return text[start], start + 1


def _brace_fracs(text: str) -> str:
    r"""``\frac12`` -> ``\frac{1}{2}``, ``\frac1{72}`` and ``\frac{1}2`` likewise, nested fracs included."""
    out: list[str] = []
    pos = 0
    while (found := text.find("\\frac", pos)) >= 0:
        after = found + len("\\frac")
        out.append(text[pos:after])
        first = _frac_argument(text, after)
        second = _frac_argument(text, first[1]) if first else None
        if first is None or second is None:
            pos = after
            continue
        out.append("{" + _brace_fracs(first[0]) + "}{" + _brace_fracs(second[0]) + "}")
        pos = second[1]
    out.append(text[pos:])
    return "".join(out)


_CANONICAL_INT = r"-?(?:0|[1-9][0-9]*)"
_SIMPLE_SLASH = re.compile(rf"({_CANONICAL_INT})/({_CANONICAL_INT})")


def _slash_to_frac(text: str) -> str:
    """``3/4`` -> ``\\frac{3}{4}`` when the whole answer is two plain integers (the MATH answers write fracs)."""
    match = _SIMPLE_SLASH.fullmatch(text)
    return f"\\frac{{{match[1]}}}{{{match[2]}}}" if match else text


def _drop_units(text: str) -> str:
    """Cut a trailing unit written as ``\\text{ cm}`` (the space marks a unit in MATH), keeping a non-empty value."""
    value = text.split("\\text{ ", 1)[0]
    return value if value.strip() else text


def _drop_short_lhs(text: str) -> str:
    """``x = 5`` -> ``5``: one "=" with a left side of at most two characters (a variable name)."""
    sides = text.split("=")
    return sides[1] if len(sides) == 2 and len(sides[0].strip()) <= 2 else text


def normalize_math_answer(answer: str) -> str:
    r"""The Hendrycks MATH normalisation (verl's ``strip_string``) in spirit, applied to both sides of a comparison.

    Drops newlines, ``\!``, ``\left``/``\right``, degrees (``^\circ``), ``\$``, ``\%``, a trailing unit
    ``\text{ ...}``, a trailing "."; ``\dfrac``/``\tfrac`` -> ``\frac``; ``.5`` -> ``0.5``; ``x = 5`` -> ``5``;
    ``\sqrt3`` -> ``\sqrt{3}``; all spaces; braces around ``\frac`` arguments; ``a/b`` -> ``\frac{a}{b}`` for plain
    integers; and, as MATH does, exactly ``0.5`` -> ``\frac{1}{2}`` (no other decimal becomes a fraction).
    Deviations from verl: the trailing "." is new; a unit is cut at the first ``\text{ `` (verl raises on two and
    falls back to the raw strings); ``\frac{1}2`` is braced too; ``\sqrt 3`` (with a space) is braced; the left
    side of "=" is measured without spaces (verl drops ``xy=3``'s but keeps ``xy = 3``'s).
    """
    text = answer.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    text = text.replace("tfrac", "frac").replace("dfrac", "frac")
    text = text.replace("\\left", "").replace("\\right", "")
    text = text.replace("^{\\circ}", "").replace("^\\circ", "")
    text = text.replace("\\$", "").replace("\\%", "")
    text = _drop_units(text).strip().rstrip(".")
    # a missing leading zero: ".5" and "{.5" read as 0.5
    text = text.replace(" .", " 0.").replace("{.", "{0.")
    if text.startswith("."):
        text = "0" + text
    text = _drop_short_lhs(text)
    text = re.sub(r"\\sqrt\s*([0-9A-Za-z])", r"\\sqrt{\1}", text)
    text = _brace_fracs(text.replace(" ", ""))
    if text == "0.5":
        text = "\\frac{1}{2}"
    return _slash_to_frac(text)


def math_reward(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 when the last boxed answer equals ``ground_truth`` after :func:`normalize_math_answer`, else 0.0 (also
    without a boxed answer). A ground truth that is itself a solution with a box is reduced to its last box."""
    answer = last_boxed_content(solution_str)
    if answer is None:
        return 0.0
    if any(command in ground_truth for command in _BOX_COMMANDS):
        ground_truth = last_boxed_content(ground_truth) or ground_truth
    return 1.0 if normalize_math_answer(answer) == normalize_math_answer(ground_truth) else 0.0


# -- format (shaping only) ---------------------------------------------------------------------------------------


def format_reward(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 when the response ends with an answer a scorer can read: a ``#### N`` that the strict gsm8k extraction
    finds, or a closed, non-empty boxed answer; else 0.0. ``ground_truth`` is ignored.

    A shaping reward: it pays for the form, never for correctness, so it never counts as accuracy.
    """
    if extract_gsm8k_answer(solution_str, "strict") is not None:
        return 1.0
    boxed = last_boxed_content(solution_str)
    return 1.0 if boxed is not None and boxed.strip() else 0.0


def gsm8k_flexible_reward(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None
) -> float:
    """:func:`gsm8k_reward` with the flexible extraction (the last number written), as verl's ``method="flexible"``."""
    return gsm8k_reward(data_source, solution_str, ground_truth, {**(extra_info or {}), "method": "flexible"})


REWARD_FNS: dict[str, RewardFn] = {
    "gsm8k": gsm8k_reward,
    "gsm8k-flexible": gsm8k_flexible_reward,
    "math": math_reward,
    "format": format_reward,
}
REWARD_FN_NAMES = tuple(REWARD_FNS)
SHAPING_ONLY = ("format",)  # built-ins that never say whether an answer is right: never reported as accuracy

# -- loading -----------------------------------------------------------------------------------------------------

DEFAULT_FUNCTION = "compute_score"  # verl's custom_reward_function.name default


def reward_file(spec: str) -> Path | None:
    """The Python file a ``--reward-fn`` spec loads from (None for a built-in name)."""
    return None if spec in REWARD_FNS else split_reward_spec(spec)[0]


def split_reward_spec(spec: str) -> tuple[Path, str]:
    """``PATH.py:FUNCTION`` or ``PATH.py`` (-> ``compute_score``); the last ":" splits, so "C:\\x.py:f" works."""
    path, sep, function = spec.rpartition(":")
    if sep and path and not function.endswith(".py"):
        return Path(path), function or DEFAULT_FUNCTION
    return Path(spec), DEFAULT_FUNCTION


def _import_file(path: Path) -> Any:
    """Import a Python file by path under a name of its own, registered so that dataclasses and pickling inside it
    find their module."""
    name = "oppo_reward_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import reward file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as error:  # sys.exit() at import would end the command without a word
        del sys.modules[name]
        first_line = (str(error).splitlines() or [""])[0]
        raise ValueError(f"importing reward file {path} failed: {type(error).__name__}: {first_line}") from error
    return module


def load_reward_fn(spec: str) -> RewardFn:
    """A reward function from a built-in name (``gsm8k``, ``math``, ``format``) or ``PATH.py:FUNCTION`` (``PATH.py``
    alone loads ``compute_score``). Raises ``ValueError`` with one line naming the problem."""
    if spec in REWARD_FNS:
        return REWARD_FNS[spec]
    path, function = split_reward_spec(spec)
    if path.suffix != ".py":
        raise ValueError(f"unknown reward {spec!r}: use a built-in ({', '.join(REWARD_FNS)}) or PATH.py:FUNCTION")
    if not path.is_file():
        raise ValueError(f"reward file not found: {path}")
    module = _import_file(path)
    if not hasattr(module, function):
        raise ValueError(f"reward file {path} has no function {function!r}")
    fn = getattr(module, function)
    if not callable(fn):
        raise ValueError(f"{function!r} in reward file {path} is not callable ({type(fn).__name__})")
    return fn
