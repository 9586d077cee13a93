"""``pyrula control ACTION [ARGS]...``: Celery's ``celery control`` on a ``pyrula_compat``
app.

There is no broadcast: pyrula workers take no remote commands. ``revoke`` and
``terminate`` work through the store, as ``app.control.revoke`` does (durably, for every
worker, even for an id not sent yet), and print Celery's reply under the node ``store``.
The other actions of ``celery control`` either have no pyrula meaning and nothing to do
(``add_consumer``, ``cancel_consumer``, ``enable_events``, ``disable_events``,
``heartbeat``: a one-line note, exit 0) or ask for something a pyrula worker cannot do
while it runs (``rate_limit``, ``time_limit``, ``shutdown``, ``pool_*``, ``autoscale``,
``election``, ``revoke_by_stamped_headers``: an error saying what to do instead, exit 1).
"""

from __future__ import annotations

import json
import signal
from typing import Any

import click

from pyrula.cli.celery_commands import app_options, load_app, note
from pyrula.cli.inspect import say_reply
from pyrula.cli.render import CliError, CliUsageError
from pyrula.workflows import PyrulaError
from pyrula.workflows.inspection import STORE_NODE

REVOKE, TERMINATE = "revoke", "terminate"
RESTART = "stop the worker with SIGTERM and start it again"
NOTED = {
    "add_consumer": "pyrula has no queues: every worker serves every task it imports",
    "cancel_consumer": "pyrula has no queues: every worker serves every task it imports",
    "enable_events": "there is no event stream: the store holds every task's state "
    "(`pyrula runs list`, `pyrula dev`)",
    "disable_events": "there is no event stream to turn off",
    "heartbeat": "workers heartbeat into the store on their own (`pyrula status`)",
}
"""Actions with nothing to do in pyrula: a note, exit 0."""
REFUSED = {
    "rate_limit": "a task's rate limit is part of its definition (rate_limit=, "
    "task_annotations), enforced across all workers together: change it there, then " + RESTART,
    "time_limit": "set time_limit=/soft_time_limit= on the task (or task_time_limit, "
    "task_soft_time_limit), then " + RESTART,
    "shutdown": "workers take no remote commands: stop each with SIGTERM (it finishes or "
    "hands back its tasks)",
    "pool_grow": "a worker's concurrency is fixed when it starts: " + RESTART + " with "
    "another -c, or start more workers",
    "pool_shrink": "a worker's concurrency is fixed when it starts: " + RESTART + " with "
    "another -c, or stop some workers",
    "autoscale": "a worker's concurrency is fixed when it starts: scale by starting and "
    "stopping workers",
    "pool_restart": "to load new code, " + RESTART,
    "election": "workers elect no leader: every worker fires schedules, each slot once",
    "revoke_by_stamped_headers": "pyrula has no stamped headers: revoke tasks by id",
}
"""Actions a pyrula worker cannot carry out: an error, exit 1."""
ACTIONS = (REVOKE, TERMINATE, *REFUSED, *NOTED)


def parse_signal(text: str, where: str) -> signal.Signals:
    """``SIGKILL``, ``KILL``, ``kill`` or ``9`` as a signal (``where``: the flag or
    argument it came from, for the message)."""
    value = text.strip().upper()
    try:
        if value.isdigit():
            return signal.Signals(int(value))
        return signal.Signals[value if value.startswith("SIG") else f"SIG{value}"]
    except (KeyError, ValueError):
        raise CliUsageError(
            f"{where}: {text!r} is not a signal name or number (SIGTERM, KILL, 9)"
        ) from None


def _revoke(
    spec: str | None,
    store_url: str | None,
    ids: tuple[str, ...],
    terminate: bool,
    sig: signal.Signals | None,
) -> str:
    """Revoke ``ids`` as ``app.control.revoke`` does; Celery's reply text. A note for
    each id that had ended (left as it is) or that no task has yet (remembered)."""
    from pyrula_compat.runstate import REVOKED_TASK, state_of
    from pyrula_compat.store import close_clients

    app, _url = load_app(spec, store_url, "control")
    try:
        client = app.client()
        before = {task_id: client.get_run(task_id) for task_id in dict.fromkeys(ids)}
        app.control.revoke(list(before), terminate=terminate, signal=sig and sig.name)
    except PyrulaError as exc:
        raise CliError(str(exc)) from None
    finally:
        close_clients()
    for task_id, record in before.items():
        if record is None:
            note(
                f"no task with id {task_id} yet: the revoke is kept, and the task is "
                "discarded if it is ever sent"
            )
        elif record.is_terminal and record.workflow != REVOKED_TASK:
            note(f"task {task_id} had ended ({state_of(record)}): left as it is")
    listed = ", ".join(before)
    what = "revoked and terminated" if terminate else "flagged as revoked"
    return f"{'task' if len(before) == 1 else 'tasks'} {listed} {what}"


@click.command("control")
@click.argument("action", type=click.Choice(ACTIONS), metavar="ACTION")
@click.argument("arguments", nargs=-1, metavar="[ARGS]...")
@click.option(
    "--terminate",
    is_flag=True,
    help="revoke: also end running tasks at once (their bodies are stopped in their "
    "worker's thread; their results are discarded).",
)
@click.option(
    "--signal",
    "signal_name",
    metavar="SIG",
    help="revoke --terminate: accepted (SIGTERM, KILL, 9); no signal is sent, the task "
    "is ended in the store.",
)
@click.option(
    "-t",
    "--timeout",
    type=float,
    default=1.0,
    metavar="SECONDS",
    help="Accepted for Celery compatibility; no effect: no reply is awaited.",
)
@click.option(
    "-d",
    "--destination",
    multiple=True,
    metavar="NAMES",
    help="Accepted for Celery compatibility; a revoke is kept in the store for every worker.",
)
@click.option("-j", "--json", "as_json", is_flag=True, help="Print the replies as JSON.")
@app_options
def control_command(
    action: str,
    arguments: tuple[str, ...],
    terminate: bool,
    signal_name: str | None,
    timeout: float,
    destination: tuple[str, ...],
    as_json: bool,
    store_url: str | None,
    celery_app: str | None,
) -> None:
    """Celery's remote control, through the store.

    \b
    revoke ID [ID]... [--terminate [--signal SIG]]
        Revoke tasks durably: a task waiting to start never runs (REVOKED), a
        running one stops at its next step boundary (--terminate: at once), an
        id not sent yet is remembered. A task that ended is left as it is.
    terminate SIG ID [ID]...
        revoke --terminate --signal SIG.
    add_consumer, cancel_consumer, enable_events, disable_events, heartbeat
        Nothing to do in pyrula: a note, exit 0.
    rate_limit, time_limit, shutdown, pool_grow, pool_shrink, pool_restart,
    autoscale, election, revoke_by_stamped_headers
        Not possible while a pyrula worker runs: an error saying what to do
        instead, exit 1.
    """
    if action in NOTED:
        note(f"control {action} accepted, no effect: {NOTED[action]}")
        return
    if action in REFUSED:
        raise CliError(f"control {action} is not available in pyrula: {REFUSED[action]}")
    if action == TERMINATE:
        if terminate or signal_name is not None:
            raise CliUsageError("control terminate takes SIG ID [ID]...: no --terminate/--signal")
        if not arguments:
            raise CliUsageError("control terminate needs a signal and one or more task ids")
        signal_name, arguments, terminate = arguments[0], arguments[1:], True
    where = "control terminate SIG" if action == TERMINATE else "--signal"
    if not arguments:
        raise CliUsageError(f"control {action} needs one or more task ids")
    sig = None if signal_name is None else parse_signal(signal_name, where)
    if sig is not None and not terminate:
        note("--signal goes with --terminate: ignored, as Celery ignores it")
        sig = None
    if sig is not None:
        note(
            f"{sig.name}: no signal is sent; a running task is ended at once in the store "
            "and its body stopped in its worker's thread"
        )
    if destination:
        note("-d accepted, no effect: a revoke is kept in the store, for every worker")
    reply: dict[str, Any] = {"ok": _revoke(celery_app, store_url, arguments, terminate, sig)}
    if as_json:
        click.echo(json.dumps([{STORE_NODE: reply}]))
    else:
        say_reply(STORE_NODE, reply, True)
