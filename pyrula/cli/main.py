"""The ``pyrula`` command group (entry point ``pyrula = "pyrula.cli.main:main"``).

Exit codes: 0 success (and a worker's clean stop), 1 a command that could not be carried
out (no such run or schedule, a run in the wrong state, a schedule id already taken, the
store unreachable, a second stop signal), 2 usage errors (bad flags or option values such
as a malformed cron expression or JSON, a workflow module that does not import), 69 for
``status`` and ``inspect`` when no live worker matches (Celery's EX_UNAVAILABLE).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

import click

from pyrula.cli import app_loader
from pyrula.cli.beat import beat_command
from pyrula.cli.celery_calls import call_command, result_command
from pyrula.cli.celery_commands import purge_command
from pyrula.cli.celery_control import control_command
from pyrula.cli.dashboard.command import dashboard_command, flower_command
from pyrula.cli.db import db_group
from pyrula.cli.dev import dev_command
from pyrula.cli.init import init_command
from pyrula.cli.inspect import inspect_command, status_command
from pyrula.cli.multi import multi_command
from pyrula.cli.operations import bulk_command, run_now_command
from pyrula.cli.projections import projections_group
from pyrula.cli.runs import runs_group
from pyrula.cli.schedules import schedules_group
from pyrula.cli.triggers import triggers_group
from pyrula.cli.worker import worker_command


def _version() -> str:
    try:
        return version("pyrula")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "unknown"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(_version(), "--version", "-V", prog_name="pyrula")
@app_loader.group_options
@click.pass_context
def cli(ctx: click.Context, /, **celery_globals: Any) -> None:
    """pyrula: durable workflows. Run workers, look after runs, manage schedules.

    Celery's global options may come before the command (`pyrula -A proj -b URL worker`)
    and mean what they mean after it.
    """
    app_loader.remember_group_options(ctx, celery_globals)


cli.add_command(worker_command)
cli.add_command(beat_command)
cli.add_command(init_command)
runs_group.add_command(bulk_command)
schedules_group.add_command(run_now_command)
cli.add_command(runs_group)
cli.add_command(schedules_group)
cli.add_command(triggers_group)
cli.add_command(projections_group)
cli.add_command(db_group)
cli.add_command(dev_command)
cli.add_command(dashboard_command)
cli.add_command(flower_command)
cli.add_command(status_command)
cli.add_command(inspect_command)
cli.add_command(purge_command)
cli.add_command(call_command)
cli.add_command(result_command)
cli.add_command(control_command)
cli.add_command(multi_command)


def main() -> None:
    """Console-script entry point. Ctrl-C before a worker has installed its signal
    handlers prints ``Aborted!`` and exits 1 (click's handling)."""
    cli.main(prog_name="pyrula")


if __name__ == "__main__":
    main()
