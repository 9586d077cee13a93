"""The ``pyrula`` command group (entry point ``pyrula = "pyrula.cli.main:main"``).

Exit codes: 0 success (and a worker's clean stop), 1 a command that could not be carried
out (no such run or schedule, a run in the wrong state, a schedule id already taken, the
store unreachable, a second stop signal), 2 usage errors (bad flags or option values such
as a malformed cron expression or JSON, a workflow module that does not import), 69 for
``status`` and ``inspect`` when no live worker matches (Celery's EX_UNAVAILABLE).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, entry_points, version
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


PLUGIN_GROUP = "pyrula.cli"
"""The entry-point group whose click commands join ``pyrula`` (the Celery drop-in's
``migrate``, ...), as Celery loads ``celery.commands``."""


class PluginGroup(click.Group):
    """A group that also lists the commands of :data:`PLUGIN_GROUP`, importing one only
    when it is asked for (so ``pyrula runs list`` imports no plugin)."""

    def _plugins(self) -> dict[str, Any]:
        return {ep.name: ep for ep in entry_points(group=PLUGIN_GROUP)}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._plugins()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        plugin = self._plugins().get(cmd_name)
        if plugin is None:
            return None
        loaded = plugin.load()
        if not isinstance(loaded, click.Command):
            raise click.ClickException(
                f"the {PLUGIN_GROUP} entry point {cmd_name!r} ({plugin.value}) is not a click "
                "command"
            )
        return loaded


@click.group(cls=PluginGroup, context_settings={"help_option_names": ["-h", "--help"]})
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
