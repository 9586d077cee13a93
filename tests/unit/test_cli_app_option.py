"""``pyrula -A APP worker``: Celery's order (the app before the subcommand) parses as
``pyrula worker -A APP``. Parse checks only (click's CliRunner, no worker started);
``tests/compat/test_cli_app_option.py`` serves a real app that way."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from pyrula.cli.main import cli

MISSING = "no_such_celery_project_xyz"


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), prog_name="pyrula", catch_exceptions=False)
    return result.exit_code, result.output


@pytest.mark.parametrize("flag", ["-A", "--app"])
def test_app_before_the_worker_command_is_the_workers_app(flag: str) -> None:
    code, out = run(flag, MISSING, "worker")
    assert code == 2
    assert f"-A {MISSING}: cannot load the app: ModuleNotFoundError" in out


def test_worker_help_parses_with_the_app_first() -> None:
    code, out = run("-A", "proj", "worker", "--help")
    assert code == 0 and "Usage: pyrula worker" in out and "--app" in out


def test_group_help_shows_the_app_option() -> None:
    code, out = run("--help")
    assert code == 0 and "-A, --app APP" in out


def test_same_app_in_both_places_is_accepted() -> None:
    code, out = run("-A", MISSING, "worker", "--app", MISSING)
    assert code == 2 and "cannot load the app" in out and "twice" not in out


def test_different_apps_in_both_places_is_a_usage_error() -> None:
    code, out = run("-A", "proj", "worker", "-A", "other")
    assert code == 2
    assert "-A/--app given twice with different values: 'proj'" in out and "'other'" in out


@pytest.mark.parametrize("command", [["runs", "list"], ["schedules", "list"], ["init"]])
def test_commands_that_take_no_app_refuse_it(command: list[str]) -> None:
    code, out = run("-A", "proj", *command)
    assert code == 2 and f"`pyrula {command[0]}` takes no app" in out


def test_worker_without_any_app_still_asks_for_one() -> None:
    code, out = run("worker")
    assert code == 2 and "give --workflow MODULE (or -A APP for a Celery app)" in out
