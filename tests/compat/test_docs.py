"""Every row of docs/coming-from-celery.md's concept map has a snippet, and each one runs.

Eager snippets run in this process with ``task_always_eager``; the others run against a
real ``pyrula worker -A docs_snippets`` process on SQLite (bash snippets: the commands
themselves, against the sample project). The snippets and their app: ``docs_snippets``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import open_store
from pyrula_compat import _state
from tests.compat import docs_snippets as docs
from tests.compat.conftest import (
    HERE,
    REPO_ROOT,
    WorkerProcess,
    Workers,
    pyrula_command,
    wait_until,
)

EAGER = {1, 2, 3, 4, 5, 6, 14, 27}
# 26 and 35 flip task_always_eager on while a worker serves the app: the next call runs
# here (35 also keeps its result in the worker's store).
WORKER = {9, 10, 11, 12, 13, 15, 16, 17, 18, 19, 22, 23, 24, 25, 26, 29, 30, 32, 33, 34, 35}
SHELL = {7, 8, 31, 36}  # 36 runs in test_cli_celery_commands.py
BEAT, DJANGO, NO_CODE = {docs.BEAT}, {28}, {21}
MODES = EAGER | WORKER | SHELL | BEAT | DJANGO | NO_CODE
T = 60


def environment(url: str, **extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO_ROOT)])}
    env.pop("PYRULA_STORE_URL", None)
    return {**env, "CELERY_BROKER_URL": url, **extra}


def _too_long(signum: int, frame: Any) -> None:
    raise AssertionError(f"the snippet ran for more than {T * 2} s")


def run_here(number: int) -> None:
    """The snippet's statements, in a copy of the docs namespace, on the docs app; the
    current app, the environment and the eager settings are put back after."""
    app = docs.app
    _, statements = docs.snippets()[number].parts()
    previous_app = _state.get_current_app()
    previous_env = {k: v for k, v in os.environ.items() if k.startswith("CELERY_")}
    conf = app.conf
    previous_conf = (
        conf.task_always_eager,
        conf.task_eager_propagates,
        conf.task_store_eager_result,
    )
    _state.set_current_app(app)
    previous_handler = signal.signal(signal.SIGALRM, _too_long)
    signal.alarm(T * 2)  # a snippet that waits in a loop fails instead of hanging
    try:
        exec(compile(statements, f"{docs.DOC.name}[{number}]", "exec"), dict(docs.NAMESPACE))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous_handler)
        _state.set_current_app(previous_app)
        for key in [k for k in os.environ if k.startswith("CELERY_")]:
            del os.environ[key]
        os.environ.update(previous_env)
        conf.task_always_eager, conf.task_eager_propagates = previous_conf[:2]
        conf.task_store_eager_result = previous_conf[2]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Workers, str]]:
    """One ``pyrula worker -A docs_snippets`` on SQLite, the docs app pointed at it."""
    tmp = tmp_path_factory.mktemp("docs")
    url = f"sqlite:///{tmp / 'docs.db'}"
    workers = Workers(tmp, url)
    previous = docs.app.conf.broker_url
    docs.app.conf.broker_url = url
    docs.app.conf.task_always_eager = False
    try:
        workers.start(app="docs_snippets")
        yield workers, url
    finally:
        workers.kill_all()
        docs.app.conf.broker_url = previous


def test_every_row_links_its_snippet() -> None:
    rows, found = docs.row_links(), docs.snippets()
    assert [n for n, _ in rows] == list(range(1, len(rows) + 1))
    assert set(found) == {n for n, _ in rows} == MODES
    anchors = {a for n, a in rows}
    for number, anchor in rows:
        assert anchor.startswith(f"{number}-") and anchor in anchors
    for number, snippet in found.items():
        if number in NO_CODE:
            assert snippet.language is None
        else:
            assert snippet.language == ("bash" if number in SHELL else "python"), number
            assert 1 <= len([x for x in snippet.code.splitlines() if x.strip()]) <= 14, number


@pytest.mark.parametrize("number", sorted(EAGER))
def test_eager_snippet(number: int) -> None:
    docs.app.conf.task_always_eager = True
    try:
        run_here(number)
    finally:
        docs.app.conf.task_always_eager = False


@pytest.mark.parametrize("number", sorted(WORKER))
def test_worker_snippet(number: int, served: tuple[Workers, str]) -> None:
    run_here(number)


def _start(words: list[str], tmp: Path, url: str, name: str) -> WorkerProcess:
    out, err = tmp / f"{name}.out", tmp / f"{name}.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [*pyrula_command(), *words[1:]], cwd=HERE, env=environment(url),
            stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    return WorkerProcess(proc, out, err)


@pytest.mark.parametrize("number", [7, 8])
def test_worker_command_snippet(number: int, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'proj.db'}"
    for index, words in enumerate(docs.snippets()[number].commands()):
        assert words[0] == "pyrula" and "proj" in words
        worker = _start(words, tmp_path, url, f"w{index}")
        try:
            worker.wait_started()
            assert "proj.tasks.add" in worker.stdout
            if number == 8:
                for note in ("-Q accepted", "-B accepted", "-O accepted"):
                    assert note in worker.stderr, (note, worker.stderr)
                assert "-P accepted" not in worker.stderr  # they work: no note
                assert "--autoscale" not in worker.stderr
                assert "through 3 to 10 pool processes" in worker.stdout
                assert "--max-tasks-per-child:" not in worker.stderr  # it works: no note
                assert "replaced after 100 runs" in worker.stdout  # by its supervisor
        finally:
            assert worker.stop() == 0, worker.stderr


def test_flower_snippet(served: tuple[Workers, str]) -> None:
    _, url = served
    assert docs.NAMESPACE["add"].delay(20, 22).get(timeout=T) == 42
    (words,) = docs.snippets()[31].commands()
    words = [url if w.startswith("sqlite:///") else w for w in words]
    done = subprocess.run(
        [*pyrula_command(), *words[1:]], cwd=HERE, env=environment(url),
        capture_output=True, text=True, timeout=T, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "proj.tasks.add" in done.stdout


def test_beat_snippet(served: tuple[Workers, str]) -> None:
    workers, url = served
    beat = workers.start(app="docs_snippets", env={"DOCS_BEAT": "1"})
    store = open_store(url)

    def schedule_ids() -> set[str]:
        return {s.schedule_id for s in asyncio.run(store.list_schedules())}

    def fired() -> list[Any]:
        runs = asyncio.run(store.list_runs(workflow="proj.tasks.greet"))
        return [r for r in runs if "hello beat" in (r.result or "")]  # JSON

    try:
        assert {"digest", "first-monday", "poll"} <= schedule_ids()
        assert wait_until(fired, T, "the poll entry to fire")
    finally:
        assert beat.stop() == 0, beat.stderr
        for schedule_id in ("digest", "first-monday", "poll"):  # the module's worker too
            asyncio.run(store.delete_schedule(schedule_id))
        asyncio.run(store.close())


def test_django_snippet(served: tuple[Workers, str], tmp_path: Path) -> None:
    pytest.importorskip("django")
    _, url = served
    code = (
        "import django\n"
        "django.setup()\n"
        "import docs_snippets as docs\n"
        "_, rest = docs.snippets()[28].parts()\n"
        "exec(compile(rest, 'snippet 28', 'exec'), dict(docs.NAMESPACE))\n"
        "print('ok')\n"
    )
    env = environment(
        url, DJANGO_SETTINGS_MODULE="djproj.settings", DJPROJ_DB=str(tmp_path / "dj.sqlite3")
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=HERE, env=env, capture_output=True, text=True,
        timeout=T, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
