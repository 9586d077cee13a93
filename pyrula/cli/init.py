"""``pyrula init [--celery] [DIR]``: write a runnable starter project.

``pyrula init`` writes a plain pyrula project; ``--celery`` a Celery-shaped one (a
``proj`` package with ``celery.py`` and ``tasks.py``) on ``pyrula_compat``. Either runs
with ``python app.py`` on the embedded SQLite store and exits 0. Existing files are
never overwritten unless ``--force``.
"""

from __future__ import annotations

from importlib.resources import files as package_files
from pathlib import Path
from typing import Any

import click

from pyrula.cli.render import CliError

SCAFFOLDS = "pyrula.scaffolds"
"""The package of the templates: the repository's ``scaffolds/`` folder, installed inside
pyrula (setup.py), read by name so no code imports it."""


def _files(root: Any, prefix: Path = Path()) -> list[tuple[Path, Any]]:
    out: list[tuple[Path, Any]] = []
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if entry.name == "__pycache__" or entry.name.endswith(".pyc"):
            continue
        if entry.is_dir():
            out.extend(_files(entry, prefix / entry.name))
        else:
            out.append((prefix / entry.name, entry))
    return out


@click.command("init")
@click.option("--celery", "celery", is_flag=True, help="A Celery-shaped project (pyrula_compat).")
@click.option("--force", is_flag=True, help="Overwrite files that exist already.")
@click.argument("directory", default=".", type=click.Path(file_okay=False, path_type=Path))
def init_command(celery: bool, force: bool, directory: Path) -> None:
    """Write a starter project into DIRECTORY (default: the current one)."""
    files = _files(package_files(SCAFFOLDS) / ("celery" if celery else "plain"))
    targets = [(directory / rel, src) for rel, src in files]
    existing = [str(path) for path, _ in targets if path.exists()]
    if existing and not force:
        raise CliError(f"not overwriting {', '.join(existing)} (pass --force to replace them)")
    for path, source in targets:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(source.read_bytes())
        click.echo(f"wrote {path}")
    where = "" if str(directory) == "." else f"cd {directory} && "
    click.echo(f"next: {where}python app.py")
    if celery:
        click.echo("then: pyrula worker -A proj -l info")
