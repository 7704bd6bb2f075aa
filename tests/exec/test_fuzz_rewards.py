"""Fuzzing the reward functions' plumbing (:mod:`oppo.exec.tasks.rewards`, :class:`oppo.exec.tasks.verifiable.Judge`):
what a user's function returns (numbers of every kind, NaN, infinities, huge integers, None, strings, dicts with and
without ``score``, their ``acc`` of any type) or raises (any exception, messages of many lines or none), the
``--reward-fn`` specs and the Python files they name (syntax errors, imports that raise, junk bytes), and the built-in
scorers on any text. :func:`score_value` gives a finite float or one-line ValueError; a judge a verdict with a finite
reward and a finite (or, for a shaping reward, NaN) answer check, or a one-line :class:`RewardFailed`; a spec a
callable or one line; a built-in 0.0 or 1.0. A handful go through ``python -m oppo.exec.train``."""

from __future__ import annotations

import decimal
import fractions
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from oppo.exec.tasks.datasets import PromptItem
from oppo.exec.tasks.rewards import REWARD_FNS, load_reward_fn, score_value
from oppo.exec.tasks.verifiable import Judge, Judgement, RewardFailed
from tests.fuzzing import assert_one_line, fuzz_settings, one_grpo_step, outcome, within
from tests.invoke import train

numbers = st.one_of(
    st.floats(),
    st.integers(),
    st.sampled_from([10**400, -(10**400), 2**1024, True, False, 0, -0.0]),
    st.fractions().map(lambda f: f * 10**400) | st.fractions(),
    st.decimals(allow_nan=True) | st.sampled_from([decimal.Decimal("1e999"), decimal.Decimal("NaN")]),
    st.complex_numbers(max_magnitude=10),
    st.sampled_from(
        [np.float32("nan"), np.float64(0.5), np.int64(3), np.float16(np.inf), np.array(1.5), np.array([1.0])]
    ),
)
others = st.one_of(st.none(), st.text(max_size=8), st.lists(st.floats(), max_size=2), st.binary(max_size=4))
keys = st.sampled_from(["score", "acc", "pred", "a\nb", ""]) | st.text(max_size=6)
results = st.recursive(
    numbers | others,
    lambda inner: (
        st.dictionaries(keys, inner, max_size=3) | st.fixed_dictionaries({"score": inner}, optional={"acc": inner})
    ),
    max_leaves=4,
)


class Odd(Exception):
    """An exception whose text cannot be made (a user's own class may break its __str__)."""

    def __str__(self):
        raise RuntimeError("no text")


KINDS = [
    ValueError,
    KeyError,
    RuntimeError,
    ZeroDivisionError,
    TypeError,
    AssertionError,
    Exception,
    MemoryError,
    RecursionError,
    SystemExit,
]
messages = st.text(max_size=20) | st.sampled_from(["", "\n", "first\nsecond", "\n\nthird"])
errors = st.builds(lambda kind, message: kind(message), st.sampled_from(KINDS), messages) | st.just(Odd())


class WordTokenizer:
    """A tokenizer that decodes ids as words (the judge only decodes)."""

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(f"w{i}" for i in ids)


ITEM = PromptItem((("user", "what is 2 ?"),), "test", "2", {"index": 0})
EOS = 0


def judge_of(fn, spec: str = "gsm8k") -> Judge:
    judge = Judge(spec, WordTokenizer(), EOS)
    judge.fn = fn
    return judge


# what a judge is given: mostly plausible returns, some of any kind; a raise one time in four
returns = st.one_of(
    results,
    st.floats(-10, 10),
    st.fixed_dictionaries(
        {"score": st.floats(-10, 10)}, optional={"acc": numbers | others | st.sampled_from([0, 1.0])}
    ),
)
raises = st.integers(0, 3).flatmap(lambda k: errors if k == 0 else st.none())


def _score(result) -> None:
    value, err = outcome(score_value, result)
    event("scored" if err is None else "refused")
    if err is None:
        assert isinstance(value, float) and math.isfinite(value), value


def _judged(result, error, spec) -> None:
    def fn(**kwargs):
        if error is not None:
            raise error
        return result

    judge = judge_of(fn, spec)
    with within():
        try:
            verdict = judge(ITEM, [3, 4, EOS], "sequence 0")
        except RewardFailed as failed:
            assert_one_line(str(failed))
            assert str(failed).startswith(f"reward function {spec} on sequence 0: "), str(failed)
            event("failed")
            return
    event("judged")
    assert isinstance(verdict, Judgement) and isinstance(verdict.reward, float) and math.isfinite(verdict.reward)
    assert isinstance(verdict.correct, float)
    assert math.isnan(verdict.correct) if spec == "format" else math.isfinite(verdict.correct), verdict


SOURCES = [
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n",
    "def compute_score(\n",  # a syntax error
    "raise RuntimeError('at import\\nsecond line')\n",
    "import no_such_module_here\n",
    "compute_score = 3\n",
    "def judge(**kw):\n    return {'score': 1}\n",
    "import sys\nsys.exit(3)\n",  # SystemExit at import
]
specs = st.one_of(
    st.sampled_from(
        [
            *REWARD_FNS,
            "gsm9k",
            "",
            ":",
            "reward.py",
            "reward.py:",
            "reward.py:judge",
            "reward.py:nothing",
            "missing.py:f",
            "C:\\x.py:f",
            "reward.txt:f",
            "folder.py:f",
        ]
    ),
    st.text(max_size=12),
)


def _loaded(folder: Path, source: str | bytes, spec: str) -> None:
    (folder / "reward.py").write_bytes(source if isinstance(source, bytes) else source.encode())
    (folder / "folder.py").mkdir(exist_ok=True)
    spec = spec.replace("reward.py", str(folder / "reward.py")).replace("folder.py", str(folder / "folder.py"))
    fn, err = outcome(load_reward_fn, spec)
    event("loaded" if err is None else "refused")
    assert err is None or isinstance(err, ValueError), err
    assert err is not None or callable(fn)


texts = st.text(max_size=400) | st.sampled_from(["#### 72", "\\boxed{\\frac12}", "\\boxed{", "\\boxed " + "{" * 500])
huge_texts = st.builds(
    lambda s, n: s * n, st.sampled_from(["\\boxed{", "#### 1,", "\\frac", "{", "9"]), st.integers(1, 20000)
)


def _builtin(name: str, solution: str, truth: str, method) -> None:
    value, err = outcome(REWARD_FNS[name], "src", solution, truth, {"method": method} if method else None)
    assert err is None or (name == "gsm8k" and method not in ("strict", "flexible")), err
    assert err is not None or value in (0.0, 1.0), value


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("rewards")


builtins = st.sampled_from(sorted(REWARD_FNS))
methods = st.sampled_from([None, "strict", "flexible", "fuzzy"])
sources = st.sampled_from(SOURCES) | st.binary(max_size=40)


@fuzz_settings(300)
@given(result=results)
def test_score_value_gives_a_finite_float_or_one_line(result):
    _score(result)


@fuzz_settings(200)
@given(result=returns, error=raises, spec=st.sampled_from(["gsm8k", "format"]))
def test_a_judge_gives_a_finite_verdict_or_fails_in_one_line(result, error, spec):
    _judged(result, error, spec)


@fuzz_settings(60)
@given(source=sources, spec=specs)
def test_reward_specs_load_a_function_or_are_refused_in_one_line(folder, source, spec):
    _loaded(folder, source, spec)


@fuzz_settings(150)
@given(name=builtins, solution=texts | huge_texts, truth=texts, method=methods)
def test_builtin_rewards_score_any_text_zero_or_one(name, solution, truth, method):
    _builtin(name, solution, truth, method)


@pytest.mark.slow
@fuzz_settings(5000)
@given(result=results)
def test_score_value_on_many_results(result):
    _score(result)


@pytest.mark.slow
@fuzz_settings(3000)
@given(result=returns, error=raises, spec=st.sampled_from(["gsm8k", "format"]))
def test_many_judged_results(result, error, spec):
    _judged(result, error, spec)


@pytest.mark.slow
@fuzz_settings(800)
@given(source=sources, spec=specs)
def test_many_reward_specs(folder, source, spec):
    _loaded(folder, source, spec)


@pytest.mark.slow
@fuzz_settings(3000)
@given(name=builtins, solution=texts | huge_texts, truth=texts, method=methods)
def test_builtin_rewards_on_much_text(name, solution, truth, method):
    _builtin(name, solution, truth, method)


# -- what the fuzzing found, one concrete case each ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ({"a\nb": 1}, "a reward dict must carry a 'score' key (its keys: 'a\\nb')"),  # was two lines
        (10**400, "a reward must be finite, got a number too large for a float"),  # was OverflowError
        (fractions.Fraction(10**400, 3), "a reward must be finite, got a number too large for a float"),  # Overflow
        ({"score": -(10**400)}, "a reward must be finite, got a number too large for a float"),  # OverflowError
    ],
    ids=["key with a line break", "huge int", "huge fraction", "huge score"],
)
def test_score_value_refuses_in_one_line(result, message):
    with pytest.raises(ValueError) as err:
        score_value(result)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ({"score": 1.0, "acc": math.nan}, "ValueError: a reward dict's 'acc' must be finite, got nan"),  # was accepted
        ({"score": 1.0, "acc": -math.inf}, "ValueError: a reward dict's 'acc' must be finite, got -inf"),  # accepted
        ({"score": 1.0, "acc": 10**400}, "ValueError: a reward dict's 'acc' must be finite, got a number too large"),
    ],
)
def test_a_judge_refuses_an_answer_check_that_is_no_finite_number(result, message):
    with pytest.raises(RewardFailed, match=f"reward function gsm8k on sequence 0: {message}"):
        judge_of(lambda **kw: result)(ITEM, [3, EOS], "sequence 0")
    assert judge_of(lambda **kw: {"score": 1.0, "acc": True})(ITEM, [3, EOS], "sequence 0").correct == 1.0


def test_a_judge_stops_on_a_reward_function_that_calls_sys_exit():
    def leaving(**kw):
        raise SystemExit(3)  # was: the process ended with code 3, not a word said

    with pytest.raises(RewardFailed, match=r"^reward function gsm8k on sequence 0: SystemExit: 3$"):
        judge_of(leaving)(ITEM, [3, EOS], "sequence 0")


def test_a_reward_file_that_calls_sys_exit_at_import_is_refused_in_one_line(tmp_path):
    (tmp_path / "reward.py").write_text("import sys\nsys.exit(3)\n")  # was SystemExit out of load_reward_fn
    with pytest.raises(ValueError, match=r"^importing reward file .*reward.py failed: SystemExit: 3$"):
        load_reward_fn(f"{tmp_path / 'reward.py'}:judge")


def test_a_judge_names_an_exception_whose_text_fails():
    def broken(**kw):
        raise Odd()  # was: the RuntimeError of its __str__, raised from the judge's own handler

    with pytest.raises(RewardFailed, match=r"^reward function gsm8k on sequence 0: Odd: $"):
        judge_of(broken)(ITEM, [3, EOS], "sequence 0")


NAN_ACC = (
    "def judge(data_source, solution_str, ground_truth, extra_info=None):\n"
    "    return {'score': 1.0, 'acc': float('nan')}\n"
)


def test_a_reward_function_whose_answer_check_is_nan_stops_the_run_in_one_line(tmp_path):
    (tmp_path / "reward.py").write_text(NAN_ACC)  # was: trained on, its NaN accuracy in the records
    (tmp_path / "data.jsonl").write_text('{"question": "t5 t6", "answer": "t3"}\n' * 2)
    reward_fn = f"{tmp_path / 'reward.py'}:judge"
    extra = ("--batch", "1", "--max-new-tokens", "4")
    res = train(*one_grpo_step(tmp_path / "data.jsonl", reward_fn, tmp_path / "run", *extra))
    assert res.returncode == 1 and "Traceback" not in res.stderr  # a run stopped by its reward: records kept
    (line,) = res.stderr.strip().splitlines()
    assert "reward function" in line and "'acc' must be finite, got nan" in line, line


@pytest.mark.parametrize(
    "source", ["def judge(\n", "raise RuntimeError('at\\nimport')\n", "judge = 3\n", "import sys\nsys.exit(3)\n"]
)
def test_a_reward_file_that_cannot_give_its_function_ends_with_exit_2_and_one_line(tmp_path, source):
    (tmp_path / "reward.py").write_text(source)
    (tmp_path / "data.jsonl").write_text('{"question": "t5 t6", "answer": "t3"}\n')
    res = train(*one_grpo_step(tmp_path / "data.jsonl", f"{tmp_path / 'reward.py'}:judge", tmp_path / "run"))
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and res.stderr.startswith("error: "), res.stderr
