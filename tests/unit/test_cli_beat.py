"""``pyrula beat`` usage errors and help: parse checks (click's CliRunner, no loop
started); ``tests/compat/test_beat_command.py`` runs real beat processes."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from pyrula.cli.main import cli

MISSING = "no_such_celery_project_xyz"


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), prog_name="pyrula", catch_exceptions=False)
    return result.exit_code, result.output


@pytest.mark.parametrize(
    "args", [["beat", "-A", MISSING], ["-A", MISSING, "beat"], ["--app", MISSING, "beat"]]
)
def test_an_app_that_does_not_import_is_a_usage_error(args: list[str]) -> None:
    code, out = run(*args)
    assert code == 2
    assert f"Error: -A {MISSING}: cannot load the app: ModuleNotFoundError" in out
    assert "Traceback" not in out


def test_a_max_interval_that_cannot_work_is_a_usage_error() -> None:
    code, out = run("beat", "--max-interval", "0")
    assert code == 2
    assert "--schedule-poll-interval: WorkerOptions.schedule_poll_interval must be > 0" in out


def test_a_store_url_of_no_known_kind_is_a_usage_error() -> None:
    code, out = run("beat", "--store", "nosuch://host/0")
    assert code == 2 and "nosuch" in out


def test_help_lists_celerys_beat_flags() -> None:
    code, out = run("beat", "--help")
    assert code == 0 and "Usage: pyrula beat" in out
    flags = ("-A, --app", "--max-interval", "-S, --scheduler", "-s, --schedule", "-l, --loglevel")
    for flag in flags:
        assert flag in out, flag
