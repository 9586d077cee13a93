"""examples/archive_worker.py runs as it is, on a real Valkey and Postgres."""

from __future__ import annotations

from tests.valkey.servers import ValkeyProcess, fresh_namespace


async def test_the_example_runs(archive_dsn: str, valkey_server: ValkeyProcess) -> None:
    from examples.archive_worker import main

    await main(valkey_server.url, archive_dsn, namespace=fresh_namespace(), ttl=0.3)
