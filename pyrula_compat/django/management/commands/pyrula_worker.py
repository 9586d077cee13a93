"""``python manage.py pyrula_worker [worker options]``: serve the project's Django tasks.

Runs ``pyrula worker --workflow pyrula_compat.django.serve`` on the store of the task
backend (``--backend``, default ``default``); every other option is ``pyrula worker``'s
(``-c``, ``--lock-ttl``, ``-l``, ...), passed on as given.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):  # type: ignore[misc]
    help = "Serve this project's django.tasks tasks with a pyrula worker."

    def run_from_argv(self, argv: list[str]) -> None:
        """Every option but ``--backend ALIAS`` is the worker's: not parsed here."""
        rest = list(argv[2:])
        backend = "default"
        if "--backend" in rest:
            at = rest.index("--backend")
            if at + 1 >= len(rest):
                raise CommandError("--backend needs a TASKS alias")
            backend = rest[at + 1]
            del rest[at : at + 2]
        self.handle(backend=backend, worker_args=rest)

    def handle(self, *args: Any, **options: Any) -> None:
        from pyrula.cli.main import cli
        from pyrula_compat.django.backend import PyrulaTaskBackend
        from pyrula_compat.django.framework import task_backends

        backend = task_backends[options["backend"]]
        if not isinstance(backend, PyrulaTaskBackend):
            raise CommandError(
                f"TASKS[{options['backend']!r}] is {type(backend).__name__}, not "
                "pyrula_compat.django.PyrulaTaskBackend"
            )
        argv = ["worker", "--workflow", "pyrula_compat.django.serve", *options["worker_args"]]
        if backend.store_url and "--store" not in options["worker_args"]:
            argv += ["--store", backend.store_url]
        cli.main(args=argv, prog_name="manage.py pyrula_worker")
