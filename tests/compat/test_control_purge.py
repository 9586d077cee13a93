"""``app.control.purge()`` (and its old name ``discard_all``): the app's waiting tasks
are revoked and counted, started ones and other apps' runs are left alone (SQLite, no
worker: nothing starts unless the test starts it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyrula.workflows import RunStatus
from tests.compat.conftest import proj_workers


def test_control_purge_revokes_the_apps_waiting_tasks(tmp_path: Path, proj_app: Any) -> None:
    import proj.tasks as t

    url = f"sqlite:///{tmp_path / 'purge.db'}"
    with proj_workers(url, tmp_path, proj_app):
        client = proj_app.client()
        other = client.submit(
            "not.this.app",
            {},
        )  # a run no task of the app owns
        waiting = [t.add.delay(1, 2), t.mul.apply_async((2, 3), countdown=600)]
        assert proj_app.control.purge() == 2
        assert [r.state for r in waiting] == ["REVOKED", "REVOKED"]
        assert client.get_run(other.run_id).status is RunStatus.QUEUED
        assert proj_app.control.discard_all() == 0  # nothing left to purge
