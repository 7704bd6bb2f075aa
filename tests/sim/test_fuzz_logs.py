"""Fuzzing the readers of real runs' logs (:func:`oppo.sim.logs.read.load_run_log`: verl and OpenRLHF console logs,
CSV and JSON-lines metric dumps, plain or gzipped): the real logs of tests/sim/data cut short, with lines dropped or
repeated, values replaced (NaN, negatives, infinities, huge numbers, words, thousands of digits), binary junk and
broken gzip; metric dumps of random rows. Each either reads as a log whose every figure is a finite non-negative
number, its steps in order, or is refused with one line (tests/fuzzing.py); some go on through ``python -m oppo.sim
validate-log`` for exit code 0, or 2 with one stderr line and no record written."""

from __future__ import annotations

import gzip
import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from oppo.sim.logs.read import LoggedStep, TrainingLog, load_run_log
from tests import invoke
from tests.fuzzing import assert_one_line, fuzz_settings, outcome, within

DATA = Path(__file__).with_name("data")
CONSOLE = [
    "verl_current_names.log",
    "openrlhf_global_step.log",
    "verl_2024_gemma_excerpt.log",
    "verl_qwen2_7b_grpo_megatron_excerpt.log.gz",
    "verl_gemma_2_2b.log.gz",
]
SMALL = ["verl_current_names.log", "openrlhf_global_step.log"]  # validate-log in well under a second


def _text(name: str) -> str:
    raw = (DATA / name).read_bytes()
    return (gzip.decompress(raw) if name.endswith(".gz") else raw).decode()


TEXTS = {name: _text(name) for name in CONSOLE}
CSV_HEAD = _text("verl_deepseek_7b_ppo_8xmi300x.csv.gz").splitlines()[:25]  # the header and 24 steps

# what a value is replaced with
ODD_VALUES = [
    "nan",
    "NaN",
    "-1",
    "-0.0",
    "inf",
    "-inf",
    "1e400",
    "1e308",
    "0",
    "abc",
    "",
    "9" * 5000,
    "0x10",
    "1_000",
    "None",
    "[1, 2]",
    "{'a': 1}",
    "True",
    "١٢",
    "1e-400",
    "+5",
    " 7 ",
]
ODD_STEPS = ["9" * 5000, "0", "1" * 30, "٣", "00", "x"]  # a step number; "x": no number, no step
odd_values = st.sampled_from(ODD_VALUES) | st.text(max_size=8) | st.floats().map(repr)
STEP = re.compile(r"(?<=step:)\d+|(?<=Global step )\d+")
VALUE = re.compile(r"-?[0-9][0-9.e+\-]*")  # any number of a line: a metric's, the step's, a pid


@st.composite
def mutated(draw, text: str) -> str:
    """``text`` with a few mutations: cut short, a line dropped or repeated, a number replaced, junk inserted."""
    lines = text.splitlines(keepends=True)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["cut", "drop", "repeat", "value", "value", "value", "junk", "swap", "step"]))
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        if op == "cut":
            lines = lines[:i] + [lines[i][: draw(st.integers(0, len(lines[i])))]]
        elif op == "drop":
            del lines[i]
        elif op == "repeat":
            lines.insert(draw(st.integers(0, len(lines))), lines[i])
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "junk":
            at = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:at] + draw(st.text(max_size=8)) + lines[i][at:]
        else:  # a number of the line (its step's: a line that has one), replaced
            numbers = list((STEP if op == "step" and STEP.search(lines[i]) else VALUE).finditer(lines[i]))
            if numbers:
                m = draw(st.sampled_from(numbers))
                new = draw(st.sampled_from(ODD_STEPS) if op == "step" else odd_values)
                lines[i] = lines[i][: m.start()] + new + lines[i][m.end() :]
    return "".join(lines)


def console_logs() -> st.SearchStrategy:
    return st.sampled_from(CONSOLE).flatmap(lambda name: mutated(TEXTS[name]))


def csv_dumps() -> st.SearchStrategy:
    return mutated("\n".join(CSV_HEAD) + "\n")


METRICS = [
    "step",
    "global_step",
    "timing_s/gen",
    "timing/gen",
    "timing_s/update_actor",
    "timing_s/ref",
    "timing_s/old_log_prob",
    "timing_s/step",
    "timing_s/testing",
    "timing/generation",
    "timing/broadcast",
    "timing/make_experience",
    "timing/ppo_train",
    "response_length/mean",
    "response_length/max",
    "response_length/min",
    "rollout/response_length_mean",
    "prompt_length/mean",
    "perf/mfu/actor",
    "perf/max_memory_reserved_gb",
    "timing_s/generate_async",
    "timing_s/sync_rollout_weights",
    "timing_s/wait_prev_gen",
    "training/global_step",
    "fully_async/count",
    "train/timing/generation",
    "response_length/clip_ratio",
    "perf/total_num_tokens",
]
json_values = st.one_of(
    st.floats(),
    st.integers(),
    st.sampled_from([0, 1, 2, 10**30, -1, 2**63]),
    st.booleans(),
    st.none(),
    st.text(max_size=6),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@st.composite
def jsonl_dumps(draw) -> str:
    """Rows of metrics: a step's timing and mean length, with metrics by their names added or put in their place,
    each value anything JSON holds (NaN and infinities as Python writes them)."""
    rows = []
    for i in range(draw(st.integers(0, 6))):
        row = (
            {"step": i + 1, "timing_s/gen": 10.0 + i, "response_length/mean": 100.0} if draw(st.integers(0, 3)) else {}
        )
        row |= draw(st.dictionaries(st.sampled_from(METRICS) | st.text(max_size=5), json_values, max_size=4))
        rows.append(row)
    lines = [json.dumps(row) for row in rows]
    if draw(st.integers(0, 3)) == 0:
        lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from(["[1]", "{", "null", "", "x"])))
    return "\n".join(lines) + "\n"


def check_log(log: TrainingLog) -> None:
    """A log read: its steps in order, every figure a finite non-negative number."""
    assert isinstance(log, TrainingLog) and log.steps
    assert [s.step for s in log.steps] == sorted(s.step for s in log.steps)
    for s in log.steps:
        assert isinstance(s, LoggedStep) and isinstance(s.step, int) and s.step >= 0
        assert isinstance(s.trainer_steps, int) and s.trainer_steps >= 1
        figures = [
            *s.stages.values(),
            s.response_mean,
            s.response_max,
            s.response_min,
            s.prompt_mean,
            s.clipped,
            s.total_tokens,
            s.mfu,
            s.memory_reserved_bytes,
            s.trainer_wait_s,
            s.async_step_s,
        ]
        for x in figures:
            assert x is None or (isinstance(x, float) and math.isfinite(x) and x >= 0), (s, x)
    log.stages  # noqa: B018 -- the stages every step logged: computed without error


def read(folder: Path, name: str, content: str | bytes, packing: str) -> None:
    raw = content.encode("utf-8", "surrogatepass") if isinstance(content, str) else content
    if packing == "gzip":
        raw, name = gzip.compress(raw), name + ".gz"
    elif packing == "broken gzip":
        raw, name = gzip.compress(raw)[: max(2, len(raw) // 3)], name + ".gz"
    path = folder / name
    path.write_bytes(raw)
    log, err = outcome(load_run_log, path)
    event("read" if log is not None else f"refused: {type(err).__name__}")
    assert err is None or path.name in str(err), f"the message does not name the file: {err}"
    if log is not None:
        check_log(log)


packings = st.sampled_from(["plain", "plain", "gzip", "broken gzip"])


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("logs")


def _console(folder, text, packing):
    read(folder, "run.log", text, packing)


def _csv(folder, text, packing):
    read(folder, "dump.csv", text, packing)


def _jsonl(folder, text, suffix):
    read(folder, f"dump{suffix}", text, "plain")


def _junk(folder, name, raw):
    read(folder, name, raw, "plain")


def _validate(folder: Path, text: str) -> None:
    """``validate-log`` on the log: done (exit 0), or exit 2 with one line and no fidelity.json."""
    log, out = folder / "v.log", folder / "out"
    log.write_text(text)
    for old in out.glob("*"):
        old.unlink()
    with within():
        res = invoke.sim("validate-log", "--log", log, "--setup", "verl-qwen2.5-0.5b-gsm8k", "--out", out)
    assert res.returncode in (0, 2), res.stderr
    if res.returncode == 2:
        assert res.stderr.startswith("error: "), res.stderr
        assert_one_line(res.stderr)
        assert not (out / "fidelity.json").exists()


@fuzz_settings(150)
@given(text=console_logs(), packing=packings)
def test_fuzzed_console_logs_read_or_are_refused_in_one_line(folder, text, packing):
    _console(folder, text, packing)


@fuzz_settings(100)
@given(text=csv_dumps(), packing=packings)
def test_fuzzed_csv_dumps_read_or_are_refused_in_one_line(folder, text, packing):
    _csv(folder, text, packing)


@fuzz_settings(150)
@given(text=jsonl_dumps(), suffix=st.sampled_from([".jsonl", ".json"]))
def test_fuzzed_jsonl_dumps_read_or_are_refused_in_one_line(folder, text, suffix):
    _jsonl(folder, text, suffix)


@fuzz_settings(50)
@given(name=st.sampled_from(["run.log", "dump.csv", "dump.jsonl", "run.log.gz"]), raw=st.binary(max_size=200))
def test_binary_junk_is_refused_in_one_line(folder, name, raw):
    _junk(folder, name, raw)


@fuzz_settings(12)
@given(text=st.sampled_from(SMALL).flatmap(lambda name: mutated(TEXTS[name])))
def test_validate_log_on_fuzzed_logs_ends_with_exit_0_or_2_and_one_line(folder, text):
    _validate(folder, text)


@pytest.mark.slow
@fuzz_settings(1500)
@given(text=console_logs(), packing=packings)
def test_many_fuzzed_console_logs(folder, text, packing):
    _console(folder, text, packing)


@pytest.mark.slow
@fuzz_settings(800)
@given(text=csv_dumps(), packing=packings)
def test_many_fuzzed_csv_dumps(folder, text, packing):
    _csv(folder, text, packing)


@pytest.mark.slow
@fuzz_settings(1500)
@given(text=jsonl_dumps(), suffix=st.sampled_from([".jsonl", ".json"]))
def test_many_fuzzed_jsonl_dumps(folder, text, suffix):
    _jsonl(folder, text, suffix)


@pytest.mark.slow
@fuzz_settings(500)
@given(name=st.sampled_from(["run.log", "dump.csv", "dump.jsonl", "run.log.gz"]), raw=st.binary(max_size=2000))
def test_much_binary_junk(folder, name, raw):
    _junk(folder, name, raw)


@pytest.mark.slow
@fuzz_settings(200)
@given(text=st.sampled_from(SMALL).flatmap(lambda name: mutated(TEXTS[name])))
def test_validate_log_on_many_fuzzed_logs(folder, text):
    _validate(folder, text)


# -- what the fuzzing found, one concrete case each ----------------------------------------------------------------


def test_a_step_number_of_thousands_of_digits_is_refused_naming_the_file(tmp_path):
    log = tmp_path / "run.log"  # was Python's own "Exceeds the limit (4300 digits) ..." alone, no file named
    log.write_text(f"step:{'9' * 5000} - timing_s/gen:1.0 - response_length/mean:5\n")
    with pytest.raises(ValueError, match=rf"^{log}: a step number of 5000 digits$"):
        load_run_log(log)
    res = invoke.sim("validate-log", "--log", log, "--setup", "verl-qwen2.5-0.5b-gsm8k", "--out", tmp_path / "out")
    assert res.returncode == 2 and res.stderr == f"error: {log}: a step number of 5000 digits\n"
    assert not (tmp_path / "out" / "fidelity.json").exists()
