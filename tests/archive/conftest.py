"""Fixtures of the archive tests: a real Postgres (tests/archive/postgres.py) and a real
Valkey (tests/valkey/servers.py)."""

from tests.archive.postgres import archive_dsn, empty_dsn, postgres_dsn  # noqa: F401
from tests.valkey.servers import valkey_server  # noqa: F401
