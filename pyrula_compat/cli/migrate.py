"""``pyrula migrate celery``: adopt a live Celery broker's messages as durable runs.

    pyrula migrate celery -A proj --from redis://old-broker:6379/0 [--dry-run]

The app (``-A``) says which tasks exist, which queues its routing names, and which store
the runs go to (its broker URL, or ``--store``). What is adopted, what is left in the old
broker and why: :mod:`pyrula_compat.migrate.adoption`. Run it again at any time: a
message adopted twice is one run, and a run interrupted by a kill finishes the messages
it had taken.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

import click

from pyrula_compat.migrate.adoption import Adoption, Report
from pyrula_compat.migrate.broker import BrokerUrlError, CeleryBroker, check_url


@click.group("migrate")
def migrate_group() -> None:
    """Move a Celery deployment onto pyrula: its broker's messages, its schedules."""


@migrate_group.command("celery")
@click.option(
    "--from",
    "source",
    required=True,
    metavar="URL",
    help="The Celery broker to adopt from (redis:// or valkey://).",
)
@click.option(
    "--app",
    "-A",
    "celery_app",
    metavar="APP",
    default=None,
    help="The Celery app (pyrula_compat): its tasks, queues and store.",
)
@click.option(
    "--store",
    "store_url",
    metavar="URL",
    default=None,
    help="The store the runs go to (default: the app's broker URL).",
)
@click.option(
    "-Q",
    "--queues",
    default=None,
    metavar="A,B",
    help="Only these queues (default: every queue the app names or the broker declares).",
)
@click.option(
    "--include-unacked",
    is_flag=True,
    help="Also adopt messages Celery workers reserved and did not acknowledge, "
    "once reserved longer than the visibility timeout (stop those workers first).",
)
@click.option(
    "--visibility-timeout",
    type=click.FloatRange(min=0),
    default=None,
    metavar="SECONDS",
    help="How long a reserved message stays its worker's "
    "(default: the app's broker_transport_options, else Celery's 3600).",
)
@click.option(
    "--key-prefix",
    default=None,
    metavar="PREFIX",
    help="The transport's global_keyprefix (default: the app's).",
)
@click.option("--dry-run", is_flag=True, help="Print what would be adopted; take nothing.")
def migrate_celery_command(
    source: str,
    celery_app: str | None,
    store_url: str | None,
    queues: str | None,
    include_unacked: bool,
    visibility_timeout: float | None,
    key_prefix: str | None,
    dry_run: bool,
) -> None:
    """Adopt the queued messages of a Celery Redis broker as durable runs."""
    from pyrula.cli.celery_commands import load_app

    try:
        check_url(source)
    except BrokerUrlError as exc:
        raise click.UsageError(str(exc)) from None
    app, url = load_app(celery_app, store_url, "migrate celery")
    if url is not None:
        app.conf.broker_url = url
    options = dict(app.conf.broker_transport_options or {})
    prefix = key_prefix if key_prefix is not None else str(options.get("global_keyprefix") or "")
    timeout = visibility_timeout
    if timeout is None:
        timeout = float(options.get("visibility_timeout") or 3600)
    broker = CeleryBroker(source, key_prefix=prefix)
    try:
        names = _queues(app, broker, queues)
        total = sum(broker.depth(key) for q in names for key, _ in broker.queue_keys(q))
        adoption = Adoption(
            app, broker, names, known=set(app.tasks.keys()), include_unacked=include_unacked,
            visibility_timeout=timeout, dry_run=dry_run,
        )  # fmt: skip
        if dry_run or total == 0 or not sys.stderr.isatty():
            report = adoption.run()
        else:
            with click.progressbar(length=total, label="adopting", file=sys.stderr) as bar:
                adoption.progress = bar.update
                report = adoption.run()
    finally:
        broker.close()
    _print(report, names)


def _queues(app: Any, broker: CeleryBroker, given: str | None) -> list[str]:
    if given:
        return [name.strip() for name in given.split(",") if name.strip()]
    return sorted(app_queues(app) | broker.declared_queues())


def app_queues(app: Any) -> set[str]:
    """The queues an app's settings and tasks name: the default queue, ``task_queues``,
    the tasks' own ``queue``, and what ``task_routes`` maps each task to."""
    from pyrula.cli.celery_commands import routed_queue

    conf = app.conf
    names = {str(conf.task_default_queue or "celery")}
    for queue in conf.task_queues or ():  # kombu Queue objects, dicts or names
        name = queue.get("name") if isinstance(queue, dict) else getattr(queue, "name", queue)
        names.add(str(name))
    for task_name, task in app.tasks.items():
        own = getattr(task, "queue", None)
        if own:
            names.add(str(getattr(own, "name", own)))
        elif conf.task_routes:
            try:
                routed = routed_queue(conf.task_routes, task_name)
            except TypeError:  # a router function: only calling it would tell
                routed = None
            if routed:
                names.add(routed)
    return names


def _print(report: Report, queues: list[str]) -> None:
    verb = "would adopt" if report.dry_run else "adopted"
    click.echo(f"queues read: {', '.join(queues) or 'none'}")
    by_task: Counter[tuple[str, str]] = Counter()
    for (task, queue, priority), count in sorted(report.adopted.items()):
        by_task[(task, queue)] += count
        click.echo(f"  {verb} {count:>7}  {task}  (queue {queue}, priority {priority})")
    click.echo(f"{verb}: {report.total}")
    if report.already:
        click.echo(f"already adopted (their runs were stored): {report.already}")
    if report.reserved:
        click.echo(
            f"left to Celery workers (reserved, unacknowledged): {report.reserved}; "
            "stop those workers and rerun with --include-unacked once their visibility "
            "timeout has passed"
        )
    if report.skipped:
        click.echo(f"left in the broker: {len(report.skipped)}")
        for skipped in report.skipped:
            what = f"{skipped.task_id or '?'} {skipped.task or '?'}"
            click.echo(f"  {skipped.where}: {what}: {skipped.reason}")
    pickled = report.pickled()
    if pickled:
        names = ", ".join(f"{task} ({count})" for task, count in sorted(pickled.items()))
        click.echo(f"pickle-serialized, never unpickled: {names}")


SHELVE_NOTE = (
    "is Celery beat's shelve file (pickle): pyrula never unpickles it. Put its entries in "
    "the app's beat_schedule (pyrula's workers fire those), or import them from "
    "django-celery-beat (--django) or redbeat (--redbeat-url)"
)


@migrate_group.command("beat")
@click.option(
    "--app",
    "-A",
    "celery_app",
    metavar="APP",
    default=None,
    help="The Celery app (pyrula_compat): its tasks, time zone and store.",
)
@click.option(
    "--store",
    "store_url",
    metavar="URL",
    default=None,
    help="The store the schedules go to (default: the app's broker URL).",
)
@click.option(
    "--django",
    "django",
    is_flag=True,
    help="Import django-celery-beat's periodic tasks through the Django project's "
    "database (DJANGO_SETTINGS_MODULE, or --django-settings).",
)
@click.option(
    "--django-settings",
    default=None,
    metavar="MODULE",
    help="The Django settings module (sets DJANGO_SETTINGS_MODULE).",
)
@click.option(
    "--redbeat-url",
    default=None,
    metavar="URL",
    help="Import celery-redbeat's entries from this Redis or Valkey.",
)
@click.option(
    "--redbeat-key-prefix",
    default=None,
    metavar="PREFIX",
    help="redbeat's key prefix (default: the app's redbeat_key_prefix, else 'redbeat:').",
)
@click.option(
    "--from-file",
    "schedule_file",
    default=None,
    metavar="PATH",
    help="A celerybeat-schedule file: refused (it is pickle).",
)
def migrate_beat_command(
    celery_app: str | None,
    store_url: str | None,
    django: bool,
    django_settings: str | None,
    redbeat_url: str | None,
    redbeat_key_prefix: str | None,
    schedule_file: str | None,
) -> None:
    """Import periodic tasks from django-celery-beat or redbeat as stored schedules."""
    import asyncio
    import os

    from pyrula.cli.celery_commands import load_app
    from pyrula.workflows import open_store
    from pyrula_compat.migrate import beat

    if schedule_file is not None:
        raise click.UsageError(f"{schedule_file} {SHELVE_NOTE}")
    if not django and not django_settings and redbeat_url is None:
        raise click.UsageError("say where the schedules are: --django or --redbeat-url URL")
    if django_settings:
        os.environ["DJANGO_SETTINGS_MODULE"] = django_settings
    app, url = load_app(celery_app, store_url, "migrate beat")
    if url is not None:
        app.conf.broker_url = url
    entries: list[beat.BeatEntry] = []
    report = beat.BeatReport()
    if django or django_settings:
        found, read = _django_entries()
        entries += found
        report.skipped += read.skipped
    if redbeat_url is not None:
        try:
            check_url(redbeat_url)
        except BrokerUrlError as exc:
            raise click.UsageError(str(exc).replace("--from", "--redbeat-url")) from None
        import valkey

        prefix = redbeat_key_prefix or str(app.conf.get("redbeat_key_prefix") or "redbeat:")
        client: Any = valkey.Valkey.from_url(redbeat_url)
        try:
            found, read = beat.read_redbeat(client, prefix)
        finally:
            client.close()
        entries += found
        report.skipped += read.skipped

    async def write() -> list[beat.BeatEntry]:
        store = open_store(app.store_url())
        await store.open()
        try:
            return await beat.import_schedules(app, store, entries, report)
        finally:
            await store.close()

    beat.queue_once(app, asyncio.run(write()), report)
    for name in report.written:
        click.echo(f"  schedule written: {name}")
    for run_id in report.once:
        click.echo(f"  one-off run queued: {run_id}")
    click.echo(f"schedules written: {len(report.written)}, unchanged: {len(report.unchanged)}, "
               f"one-off runs: {len(report.once)}")  # fmt: skip
    if report.skipped:
        click.echo(f"not imported: {len(report.skipped)}")
        for name, why in report.skipped:
            click.echo(f"  {name}: {why}")
    for name, note in report.notes:
        click.echo(f"note: {name}: {note}")


def _django_entries() -> tuple[list[Any], Any]:
    """django-celery-beat's periodic tasks, read through the project's database."""
    import django
    from django.db import connection
    from django.db.utils import DatabaseError

    from pyrula_compat.migrate import beat

    django.setup()
    try:
        with connection.cursor() as cursor:
            cursor.execute(beat.DJANGO_QUERY)
            rows = cursor.fetchall()
    except DatabaseError as exc:
        raise click.ClickException(
            f"cannot read django-celery-beat's tables ({exc}): is django_celery_beat migrated "
            "in this database?"
        ) from None
    return beat.read_django_celery_beat(rows)
