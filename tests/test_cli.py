"""Command-line helpers shared by both CLIs: options from config dataclasses, one-line user errors."""

import argparse
import subprocess
import sys

import pytest

from oppo import ScheduleConfig
from oppo.cli import add_config_args, given_options


def test_cli_from_config():
    parser = argparse.ArgumentParser()
    add_config_args(parser, ScheduleConfig)
    args = parser.parse_args(["--batch", "12", "--chunk-candidates", "8,16", "--delta", "3"])
    cfg = ScheduleConfig(**given_options(ScheduleConfig, args))
    assert cfg.batch == 12 and cfg.chunk_candidates == (8, 16) and cfg.fixed_delta == 3
    assert cfg.max_new_tokens == ScheduleConfig().max_new_tokens
    assert "prompt groups trained per step" in parser.format_help()


@pytest.mark.parametrize(
    "raised, code, stderr",
    [
        ("ValueError('unknown setup x; choose from a, b')", 2, "error: unknown setup x; choose from a, b\n"),
        ("FileNotFoundError('lengths file not found: x.csv')", 2, "error: lengths file not found: x.csv\n"),
        ("KeyError(17)", 1, "KeyError: 17"),  # a bug: its traceback, not a user error
        ("AttributeError('no')", 1, "AttributeError: no"),
    ],
)
def test_run_cli_one_line_for_bad_input_traceback_for_a_bug(raised, code, stderr):
    script = f"import sys; from oppo.cli import run_cli\ndef main(argv): raise {raised}\nsys.exit(run_cli(main))"
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert res.returncode == code
    if code == 2:
        assert res.stderr == stderr
    else:
        assert "Traceback (most recent call last)" in res.stderr and res.stderr.rstrip().endswith(stderr)


def test_every_default_schedule_explores_chunks_and_windows_under_its_cap():
    """The core's defaults, the executor's presets' and each simulator setup's hold together: exploration tries a
    chunk shorter than the response cap (one at the cap streams nothing before the end), and a T-PPO window
    truncates (a window at the cap would be sync)."""
    from oppo.core.config import ScheduleConfig
    from oppo.exec.config import default_schedule
    from oppo.sim.setup.presets import PRESETS
    from oppo.sim.setup.toml_file import load_setup

    schedules = {"core": ScheduleConfig(), "executor": default_schedule()}
    schedules |= {name: load_setup(name).schedule() for name in PRESETS}
    for name, s in schedules.items():
        assert min(s.chunk_candidates) < s.max_new_tokens and s.window_tokens < s.max_new_tokens, name
