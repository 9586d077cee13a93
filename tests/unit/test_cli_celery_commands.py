"""``pyrula purge``, ``call``, ``result`` and ``control``: the checks made before any app
is loaded or store opened (click's CliRunner, in-process), and how ``-Q``/``-X`` read
``task_routes``. ``tests/compat/test_cli_celery_commands.py`` runs the commands against
a real worker."""

from __future__ import annotations

import re
import signal

import pytest
from click.testing import CliRunner

from pyrula.cli.celery_commands import routed_queue
from pyrula.cli.celery_control import parse_signal
from pyrula.cli.main import cli
from pyrula.cli.render import CliUsageError


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), prog_name="pyrula", catch_exceptions=False)
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-a", "[2"], "-a/--args is not valid JSON"),
        (["-a", '{"x": 1}'], "-a/--args must be a JSON array"),
        (["-k", "[1]"], "-k/--kwargs must be a JSON object"),
        (["-k", "NaN"], "-k/--kwargs is not valid JSON"),
        (["--eta", "tomorrow"], "--eta: 'tomorrow' is not an ISO 8601 time"),
        (["--expires", "soon"], "--expires: 'soon' is neither seconds nor an ISO 8601 time"),
        (["--serializer", "pickle"], "--serializer pickle: pyrula stores task arguments as JSON"),
    ],
)
def test_call_refuses_bad_values_before_loading_anything(args: list[str], message: str) -> None:
    code, out = run("-A", "no_such_project_xyz", "call", "proj.tasks.add", *args)
    assert code == 2 and message in out and "cannot load the app" not in out


@pytest.mark.parametrize(
    ("command", "plain"),
    [
        (["call", "x"], "runs submit"),
        (["result", "x"], "runs show"),
        (["control", "revoke", "x"], "runs cancel"),
    ],
)
def test_the_celery_commands_need_an_app(command: list[str], plain: str) -> None:
    code, out = run(*command)
    assert code == 2
    assert f"`pyrula {command[0]}` needs a Celery app: give -A APP" in out and plain in out


def test_an_app_that_does_not_load_is_a_usage_error() -> None:
    code, out = run("-A", "no_such_project_xyz", "result", "some-id")
    assert code == 2 and "-A no_such_project_xyz: cannot load the app" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give -A APP (a Celery app's tasks) or --workflow NAME"),
        (["-A", "proj", "--workflow", "w"], "give -A APP or --workflow NAME, not both"),
        (["--workflow", "w", "-Q", "q"], "-Q/-X pick a Celery app's tasks by queue: give -A APP"),
    ],
)
def test_purge_needs_an_app_or_workflows(args: list[str], message: str) -> None:
    code, out = run("purge", *args)
    assert code == 2 and message in out


def test_the_app_may_come_before_each_command() -> None:
    for command in ("purge", "call", "result", "control"):
        code, out = run("-A", "proj", command, "--help")
        assert code == 0 and f"Usage: pyrula {command}" in out


@pytest.mark.parametrize(
    ("action", "fix"),
    [
        ("rate_limit", "a task's rate limit is part of its definition"),
        ("time_limit", "set time_limit=/soft_time_limit= on the task"),
        ("shutdown", "stop each with SIGTERM"),
        ("pool_grow", "another -c"),
        ("pool_shrink", "another -c"),
        ("autoscale", "starting and stopping workers"),
        ("pool_restart", "to load new code"),
        ("election", "workers elect no leader"),
        ("revoke_by_stamped_headers", "revoke tasks by id"),
    ],
)
def test_control_actions_pyrula_cannot_carry_out_exit_1(action: str, fix: str) -> None:
    code, out = run("control", action, "proj.tasks.add", "10/s", "-A", "proj")
    assert code == 1
    assert out.startswith(f"Error: control {action} is not available in pyrula: ") and fix in out


@pytest.mark.parametrize(
    "action", ["add_consumer", "cancel_consumer", "enable_events", "disable_events", "heartbeat"]
)
def test_control_actions_with_nothing_to_do_are_noted(action: str) -> None:
    code, out = run("-A", "proj", "control", action, "foo")
    assert code == 0 and out.startswith(f"note: control {action} accepted, no effect: ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bogus"], "Invalid value for 'ACTION': 'bogus' is not one of 'revoke'"),
        (["revoke"], "control revoke needs one or more task ids"),
        (["terminate"], "control terminate needs a signal and one or more task ids"),
        (["terminate", "KILL"], "control terminate needs one or more task ids"),
        (["terminate", "KILL", "id", "--terminate"], "no --terminate/--signal"),
        (["terminate", "SIGBOGUS", "id"], "control terminate SIG: 'SIGBOGUS' is not a signal"),
        (["revoke", "id", "--terminate", "--signal", "9x"], "--signal: '9x' is not a signal"),
    ],
)
def test_control_usage_errors(args: list[str], message: str) -> None:
    code, out = run("-A", "no_such_project_xyz", "control", *args)
    assert code == 2 and message in out


@pytest.mark.parametrize(
    ("text", "expected"),
    [("SIGKILL", signal.SIGKILL), ("kill", signal.SIGKILL), ("15", signal.SIGTERM)],
)
def test_signals_by_name_or_number(text: str, expected: signal.Signals) -> None:
    assert parse_signal(text, "--signal") is expected


def test_an_unknown_signal_names_where_it_came_from() -> None:
    with pytest.raises(CliUsageError, match="--signal: 'NOPE'"):
        parse_signal("NOPE", "--signal")


ROUTES = {
    "proj.tasks.add": "math",
    "proj.tasks.mail_*": {"queue": "mail", "routing_key": "m"},
    re.compile(r"proj\.reports\..*"): {"queue": "slow"},
    "proj.tasks.keyed": {"routing_key": "k"},
}


@pytest.mark.parametrize(
    ("routes", "name", "queue"),
    [
        (ROUTES, "proj.tasks.add", "math"),
        (ROUTES, "proj.tasks.mail_welcome", "mail"),
        (ROUTES, "proj.reports.monthly", "slow"),
        (ROUTES, "proj.tasks.keyed", None),  # a route without a queue: the default
        (ROUTES, "proj.tasks.mul", None),
        ([{"proj.tasks.mul": "a"}, [("proj.*", "b")]], "proj.tasks.mul", "a"),
        ([{"proj.tasks.mul": "a"}, [("proj.*", "b")]], "proj.tasks.add", "b"),
        ({"proj.*": "glob", "proj.tasks.add": "exact"}, "proj.tasks.add", "exact"),
    ],
)
def test_task_routes_as_celery_reads_them(routes: object, name: str, queue: str | None) -> None:
    assert routed_queue(routes, name) == queue


@pytest.mark.parametrize("routes", [lambda *a, **k: {"queue": "x"}, ["proj.routers.Router"]])
def test_routers_that_run_code_cannot_be_read(routes: object) -> None:
    with pytest.raises(TypeError):
        routed_queue(routes, "proj.tasks.add")
