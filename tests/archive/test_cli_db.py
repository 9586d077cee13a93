"""``pyrula db migrate`` and ``pyrula db check`` against a real Postgres and Valkey."""

from __future__ import annotations

import psycopg
import pytest
from click.testing import CliRunner

from pyrula.cli.main import cli
from pyrula.workflows.stores.archive.postgres.sql import pyrula_version
from tests.valkey.servers import ValkeyProcess, free_port, fresh_namespace


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), env=env)
    return result.exit_code, result.output


def test_migrate_is_idempotent_and_refuses_another_version(empty_dsn: str) -> None:
    code, out = invoke("db", "migrate", "--postgres-dsn", empty_dsn)
    assert code == 0 and out.startswith("OK: ") and pyrula_version() in out
    code, out = invoke("db", "migrate", env={"PYRULA_POSTGRES_DSN": empty_dsn})
    assert code == 0 and out.startswith("OK: ")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("UPDATE pyrula_schema SET pyrula_version = '0.0.1-other'")
    code, out = invoke("db", "migrate", "--postgres-dsn", empty_dsn)
    assert code == 1
    assert "migrated by pyrula 0.0.1-other" in out and "There is no upgrade path" in out
    assert "Traceback" not in out


def test_check_says_ok_when_both_are_ready(archive_dsn: str, valkey_server: ValkeyProcess) -> None:
    url = f"{valkey_server.url}?namespace={fresh_namespace()}"
    code, out = invoke("db", "check", "--valkey-url", url, "--postgres-dsn", archive_dsn)
    assert code == 0, out
    assert out.startswith("OK: ") and len(out.strip().splitlines()) == 1


@pytest.mark.parametrize("problem", ["no schema", "other version", "valkey down"])
def test_check_fails_with_the_errors_message(
    empty_dsn: str, valkey_server: ValkeyProcess, problem: str
) -> None:
    url = f"{valkey_server.url}?namespace={fresh_namespace()}"
    if problem != "no schema":
        assert invoke("db", "migrate", "--postgres-dsn", empty_dsn)[0] == 0
    if problem == "other version":
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            conn.execute("UPDATE pyrula_schema SET pyrula_version = '0.0.1-other'")
    if problem == "valkey down":
        url = f"redis://127.0.0.1:{free_port()}?socket_timeout=2"
    code, out = invoke("db", "check", "--valkey-url", url, env={"PYRULA_POSTGRES_DSN": empty_dsn})
    assert code == 1 and out.startswith("Error: ") and "Traceback" not in out
    expected = {
        "no schema": "has no pyrula schema: run `pyrula db migrate",
        "other version": "There is no upgrade path",
        "valkey down": "127.0.0.1",
    }[problem]
    assert expected in out


def test_the_dsn_is_required(valkey_server: ValkeyProcess) -> None:
    code, out = invoke("db", "check", "--valkey-url", valkey_server.url, env={})
    assert code == 2 and "--postgres-dsn" in out
