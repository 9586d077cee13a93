"""``app.on_after_configure``, and the beat entries ``app.add_periodic_task`` makes.

As in Celery, ``on_after_configure`` is sent when the app's configuration loads: on the
first read of a setting, in whatever process (a worker, ``pyrula beat``, a web process,
a test), after ``on_configure`` and before ``on_after_finalize``. So the documented
recipe::

    @app.on_after_configure.connect
    def setup_periodic_tasks(sender, **kwargs):
        sender.add_periodic_task(10.0, test.s("hello"), name="add every 10")

fills ``beat_schedule`` wherever the app is used. It is sent once per app: pyrula's
worker, ``pyrula beat`` and the app commands send it explicitly too (after
``finalize``), which loads the configuration if nothing read it yet and sends nothing
more.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pyrula_compat.signals import Receiver, Signal

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery
    from pyrula_compat.config import Settings

log = logging.getLogger("pyrula_compat")


class ConfigureSignal(Signal):
    """``on_after_configure``: sent by the app when ``conf`` loads, once."""

    def __init__(self, name: str, conf: Settings) -> None:
        super().__init__(name)
        self._conf = conf
        self._sent = False
        self._responses: list[tuple[Receiver, Any]] = []

    @property
    def sent(self) -> bool:
        return self._sent

    def send(self, sender: Any = None, **named: Any) -> list[tuple[Receiver, Any]]:
        """Load the configuration, which sends the signal, unless it was sent: a second
        send (pyrula's worker sends it after ``finalize``) sends nothing."""
        if self._sent:
            return []
        if not self._conf.configured:
            self._conf.load()  # the app sends it as the configuration loads
            if self._sent:
                return self._responses
        return self.fire(sender, **named)

    send_robust = send

    def fire(self, sender: Any = None, **named: Any) -> list[tuple[Receiver, Any]]:
        """Send it to the receivers, once (the app does, as its configuration loads)."""
        if self._sent:
            return []
        self._sent = True
        self._responses = super().send(sender, **named)
        return self._responses


def periodic_entry(
    app: Celery,
    schedule: Any,
    sig: Any,
    args: Any,
    kwargs: Any,
    name: str | None,
    opts: dict[str, Any],
) -> tuple[str, dict[str, Any]]:
    """Celery's ``_sig_to_periodic_task_entry``: the signature with ``args`` and
    ``kwargs`` (a task, or anything with a ``name``, becomes one), keyed by ``name`` or
    the signature's ``repr``; ``opts`` become its options."""
    kwargs = dict(kwargs) if kwargs else {}
    if hasattr(sig, "clone") and hasattr(sig, "options"):
        sig = sig.clone(args, kwargs)
    else:
        sig = app.signature(sig.name, args, kwargs)
    entry = {
        "schedule": schedule,
        "task": sig.name,
        "args": sig.args,
        "kwargs": sig.kwargs,
        "options": {**dict(sig.options), **opts},
    }
    return name or repr(sig), entry


def add_periodic(app: Celery, key: str, entry: dict[str, Any], name: str | None) -> None:
    """Put ``entry`` in ``app.conf.beat_schedule`` (an unnamed entry replacing another
    is logged, as in Celery)."""
    schedule = app.conf.beat_schedule
    if name is None and key in schedule:
        log.warning(
            "Periodic task key=%r shadowed a previous unnamed periodic task. Pass a name "
            "kwarg to add_periodic_task to silence this warning.", key,
        )  # fmt: skip
    schedule[key] = entry


__all__ = ["ConfigureSignal", "add_periodic", "periodic_entry"]
