"""``import pyrula.workflows`` (and the blocking client, the worker and a SQLite store)
does not import valkey-py: a project on SQLite or the memory store never loads it. The
first use of ``ValkeyStore`` does."""

from __future__ import annotations

import subprocess
import sys


def _imported_valkey(code: str) -> bool:
    probe = f"import sys\n{code}\nprint('valkey' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return done.stdout.strip() == "True"


def test_the_library_and_a_sqlite_store_do_not_import_valkey() -> None:
    assert not _imported_valkey(
        "import pyrula.workflows, pyrula.workflows.sync, pyrula.workflows.worker\n"
        "from pyrula.workflows import open_store\nopen_store('sqlite:///x.db')"
    )


def test_valkey_store_is_imported_on_first_use() -> None:
    assert _imported_valkey("from pyrula.workflows import ValkeyStore")
