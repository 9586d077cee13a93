"""Fixtures of the archive tests: a real Postgres (tests/archive/postgres.py), a real
Valkey (tests/valkey/servers.py), and an ArchivingStore over both on a fake clock
(tests/archive/archiving_helpers.py: ``store``, ``clock``)."""

from tests.archive.archiving_helpers import clock, store  # noqa: F401
from tests.archive.postgres import archive_dsn, empty_dsn, postgres_dsn  # noqa: F401
from tests.valkey.servers import valkey_server  # noqa: F401
