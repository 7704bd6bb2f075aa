"""Rule-based rewards (verl's ``compute_score`` convention): extraction, normalisation, loading, result forms."""

from __future__ import annotations

import math

import pytest

from oppo.exec.tasks.rewards import (
    GSM8K_CLIP_CHARS,
    REWARD_FNS,
    extract_gsm8k_answer,
    format_reward,
    gsm8k_reward,
    last_boxed_content,
    load_reward_fn,
    math_reward,
    normalize_math_answer,
    score_value,
)


def gsm8k(solution: str, truth: str, method: str | None = None) -> float:
    return gsm8k_reward("openai/gsm8k", solution, truth, {"method": method} if method else None)


def boxed(solution: str, truth: str) -> float:
    return math_reward("lighteval/MATH", solution, truth)


# -- gsm8k -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("solution", "truth", "strict", "flexible"),
    [
        ("3 + 4 = 7 apples.\n#### 7", "7", 1.0, 1.0),
        ("3 + 4 = 8 apples.\n#### 8", "7", 0.0, 0.0),
        ("3 + 4 = 7, so the answer is 7", "7", 0.0, 1.0),  # no marker: only flexible reads it
        ("the balance is -12\n#### -12", "-12", 1.0, 1.0),
        ("the balance is 12\n#### 12", "-12", 0.0, 0.0),
        ("#### -12", "12", 0.0, 0.0),  # the sign is part of the answer
        ("in all 1,234 beads\n#### 1,234", "1234", 1.0, 0.0),  # strict drops commas; verl's flexible does not
        ("it costs $18 in all\n#### 18", "18", 1.0, 1.0),
        ("#### $18", "18", 0.0, 1.0),  # "$" right after "#### " is not matched by verl's strict pattern
        ("The answer is 42.", "42", 0.0, 0.0),  # flexible keeps the sentence's period: "42." != "42"
        ("Answer: 7 .", "7", 0.0, 1.0),  # a lone "." is skipped, the number before it is read
        ("####7", "7", 0.0, 1.0),  # strict needs exactly one space after the hashes
    ],
)
def test_gsm8k_strict_and_flexible(solution: str, truth: str, strict: float, flexible: float) -> None:
    assert gsm8k(solution, truth) == strict  # strict is the default
    assert gsm8k(solution, truth, "strict") == strict
    assert gsm8k(solution, truth, "flexible") == flexible


def test_gsm8k_takes_the_last_marked_answer() -> None:
    solution = "First try:\n#### 3\nNo, I misread the question.\n#### 5"
    assert extract_gsm8k_answer(solution) == "5"
    assert gsm8k(solution, "5") == 1.0
    assert gsm8k(solution, "3") == 0.0


def test_gsm8k_flexible_takes_the_last_number() -> None:
    assert extract_gsm8k_answer("She has 3 apples and 5 pears.", "flexible") == "5"
    assert extract_gsm8k_answer("3 apples, so in all: 5.", "flexible") == "5."  # the period sticks to the number
    assert extract_gsm8k_answer("no digits here", "flexible") is None


def test_gsm8k_reads_only_the_tail() -> None:
    early = "#### 72\n" + "x" * GSM8K_CLIP_CHARS  # the marker falls outside the clipped tail
    assert extract_gsm8k_answer(early) is None
    assert gsm8k(early, "72") == 0.0
    late = "x" * 10 * GSM8K_CLIP_CHARS + "\n#### 72"
    assert gsm8k(late, "72") == 1.0


def test_gsm8k_unknown_method_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown gsm8k method 'loose'"):
        gsm8k("#### 7", "7", "loose")


# -- math --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("solution", "truth"),
    [
        (r"so $\boxed{\frac{1}{2}}$", r"\frac12"),  # nested braces, braced vs bare fraction arguments
        (r"\boxed{\dfrac{3}{4}}", "3/4"),
        (r"\boxed{1/2}", r"\frac{1}{2}"),
        (r"\boxed{0.5}", r"\frac12"),  # MATH maps exactly 0.5 to one half
        (r"\boxed{.5}", r"\frac{1}{2}"),  # missing leading zero, then the 0.5 rule
        (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt3}{2}"),
        (r"\boxed{\frac{\frac12}{3}}", r"\frac{\frac{1}{2}}{3}"),
        (r"\boxed{x = 3}", "3"),
        (r"\boxed{90^\circ}", "90"),
        (r"\boxed{\$5}", "5"),
        (r"\boxed{10\text{ cm}}", "10"),
        (r"\boxed{\left( 1, 2 \right)}", "(1,2)"),
        (r"\boxed{7.}", "7"),
        (r"\fbox{7}", "7"),
        ("\\boxed 7$ done", "7"),
    ],
)
def test_math_equal_after_normalisation(solution: str, truth: str) -> None:
    assert boxed(solution, truth) == 1.0


@pytest.mark.parametrize(
    ("solution", "truth"),
    [
        (r"\boxed{\frac{1}{3}}", r"\frac12"),
        (r"\boxed{0.25}", r"\frac14"),  # no decimal other than 0.5 becomes a fraction
        (r"\boxed{abc = 3}", "3"),  # a left side longer than two characters is kept
        (r"\boxed{2/4}", r"\frac{1}{2}"),  # fractions are compared as written, not reduced
        (r"\boxed{12}", "1,2"),
    ],
)
def test_math_different_after_normalisation(solution: str, truth: str) -> None:
    assert boxed(solution, truth) == 0.0


def test_math_without_a_box_scores_zero() -> None:
    assert boxed(r"The answer is \frac{1}{2}.", r"\frac{1}{2}") == 0.0
    assert boxed("#### 7", "7") == 0.0


def test_math_last_box_wins() -> None:
    solution = r"Maybe \boxed{3}? No: \boxed{4}."
    assert last_boxed_content(solution) == "4"
    assert boxed(solution, "4") == 1.0
    assert boxed(solution, "3") == 0.0
    # a later space form or \fbox also beats an earlier braced box
    assert last_boxed_content("\\boxed{3} then \\boxed 4$") == "4"
    assert last_boxed_content(r"\boxed{3} then \fbox{4}") == "4"


def test_math_unclosed_last_box_has_no_answer() -> None:
    truncated = r"\boxed{3} and finally \boxed{\frac{1}{"
    assert last_boxed_content(truncated) is None
    assert boxed(truncated, "3") == 0.0


def test_math_boxed_ground_truth_is_extracted() -> None:
    truth = r"Half of the pie is left, so the answer is $\boxed{\frac{1}{2}}$."
    assert boxed(r"\boxed{1/2}", truth) == 1.0
    assert boxed(r"\boxed{1/3}", truth) == 0.0


def test_normalize_math_answer_pieces() -> None:
    assert normalize_math_answer(r"\tfrac 3 4") == r"\frac{3}{4}"
    assert normalize_math_answer(r"\frac1{72}") == r"\frac{1}{72}"
    assert normalize_math_answer(r"2\sqrt3") == r"2\sqrt{3}"
    assert normalize_math_answer(r"50\%") == "50"
    assert normalize_math_answer("07/2") == "07/2"  # only canonical integers become a \frac


# -- format ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("solution", "expected"),
    [
        ("so\n#### 5", 1.0),
        (r"so $\boxed{5}$", 1.0),
        ("\\boxed 5$", 1.0),
        ("The answer is 5", 0.0),
        (r"\boxed{}", 0.0),
        (r"\boxed{5", 0.0),
        ("#### $5", 0.0),
        ("#### 5\n" + "y" * GSM8K_CLIP_CHARS, 0.0),  # the strict gsm8k scorer would not see this marker
    ],
)
def test_format_reward(solution: str, expected: float) -> None:
    assert format_reward("any", solution, "5") == expected


def test_format_reward_ignores_correctness() -> None:
    assert format_reward("openai/gsm8k", "#### 4", "5") == 1.0
    assert gsm8k("#### 4", "5") == 0.0


# -- convention and result forms ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(REWARD_FNS))
def test_builtins_take_verls_keyword_call(name: str) -> None:
    fn = load_reward_fn(name)
    assert fn is REWARD_FNS[name]
    result = fn(data_source="openai/gsm8k", solution_str="#### 5 $\\boxed{5}$", ground_truth="5", extra_info=None)
    assert score_value(result) == 1.0


def test_score_value_accepts_numbers_and_score_dicts() -> None:
    assert score_value(1) == 1.0
    assert score_value(0.25) == 0.25
    assert score_value({"score": 0.5, "acc": True}) == 0.5


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ({"acc": 1.0}, "must carry a 'score' key \\(its keys: acc\\)"),
        ({}, "its keys: none"),
        ("1.0", "got str"),
        (None, "got NoneType"),
        ({"score": "1"}, "got str"),
        (math.nan, "must be finite"),
        ({"score": math.inf}, "must be finite"),
    ],
)
def test_score_value_rejects(result: object, message: str) -> None:
    with pytest.raises(ValueError, match=message) as error:
        score_value(result)
    assert "\n" not in str(error.value)


# -- load_reward_fn ----------------------------------------------------------------------------------------------

USER_REWARDS = """
from dataclasses import dataclass


@dataclass
class Verdict:  # a dataclass needs its module in sys.modules
    correct: bool


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    verdict = Verdict(solution_str.strip() == ground_truth)
    return {"score": 1.0 if verdict.correct else -1.0, "source": data_source}


def length_penalty(data_source, solution_str, ground_truth, extra_info=None):
    return -len(solution_str) / 100


not_a_function = 3
"""


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(USER_REWARDS)
    return path


def test_load_user_function_returning_a_dict(user_file) -> None:
    fn = load_reward_fn(f"{user_file}:compute_score")
    result = fn(data_source="d", solution_str=" 42 ", ground_truth="42", extra_info={})
    assert result == {"score": 1.0, "source": "d"}
    assert score_value(result) == 1.0
    assert score_value(fn(data_source="d", solution_str="41", ground_truth="42")) == -1.0


def test_load_user_file_defaults_to_compute_score(user_file) -> None:
    fn = load_reward_fn(str(user_file))
    assert fn.__name__ == "compute_score"


def test_load_user_function_by_name(user_file) -> None:
    fn = load_reward_fn(f"{user_file}:length_penalty")
    assert fn("d", "x" * 50, "") == -0.5


@pytest.mark.parametrize("spec", ["gsm9k", "math:compute_score", "rewards.txt:f"])
def test_load_unknown_name_lists_builtins(spec: str) -> None:
    with pytest.raises(
        ValueError, match=f"unknown reward '{spec}': use a built-in \\(gsm8k, gsm8k-flexible, math, format\\)"
    ):
        load_reward_fn(spec)


def test_load_missing_file(tmp_path) -> None:
    missing = tmp_path / "absent.py"
    with pytest.raises(ValueError, match="reward file not found: .*absent.py"):
        load_reward_fn(f"{missing}:compute_score")


def test_load_missing_function(user_file) -> None:
    with pytest.raises(ValueError, match="has no function 'nope'"):
        load_reward_fn(f"{user_file}:nope")


def test_load_not_callable(user_file) -> None:
    with pytest.raises(ValueError, match="'not_a_function' in reward file .* is not callable \\(int\\)"):
        load_reward_fn(f"{user_file}:not_a_function")


def test_load_file_that_fails_to_import(tmp_path) -> None:
    path = tmp_path / "broken.py"
    path.write_text("raise RuntimeError('no GPU here\\nsecond line')\n")
    with pytest.raises(ValueError, match="importing reward file .*broken.py failed: RuntimeError: no GPU here$"):
        load_reward_fn(str(path))
