"""Running ``pyrula`` in-process (click's CliRunner) and checking what it printed: the
helpers the CLI tests share."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner, Result

from pyrula.cli.main import cli


def invoke(*args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=stdin, env=env, catch_exceptions=False)


def ok(*args: str, stdin: str | None = None) -> Result:
    result = invoke(*args, stdin=stdin)
    assert result.exit_code == 0, result.output
    return result


def ok_json(*args: str) -> Any:
    return json.loads(ok(*args, "--json").stdout)


def assert_one_error_line(result: Result, exit_code: int, *needles: str) -> None:
    """The command failed with ``exit_code`` and one ``Error: ...`` line holding every
    needle on stderr, nothing on stdout."""
    assert result.exit_code == exit_code, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
