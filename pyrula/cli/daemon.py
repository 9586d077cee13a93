"""Celery's daemon options for long-running commands (``pyrula worker``, ``pyrula beat``).

Deployment scripts written for Celery (init scripts, systemd units, supervisor files)
start workers with ``--logfile``, ``--pidfile`` and sometimes ``--detach`` and
``--uid``/``--gid``; these behave here as they do for ``celery worker``:

* ``-f/--logfile FILE``: log records go to FILE (appended; reopened when logrotate moves
  it) instead of stderr.
* ``--pidfile FILE``: the process id is written to FILE, created exclusively, and removed
  at exit. A FILE naming a live process stops the start (exit 1); a stale one is replaced.
* ``-D/--detach``: the command starts again in the background, in a new session, with
  its standard streams on ``/dev/null`` (stderr on the log file when one is given), and
  the foreground process exits 0 at once. ``--executable`` is the Python it starts.
* ``--uid``/``--gid`` (a name or a number): the process drops to that user and group
  before it serves; ``--umask`` (octal) and ``--workdir`` apply before anything else.

The file names expand Celery's node-name placeholders: ``%n`` the name before the ``@``
of ``-n/--hostname``, ``%h`` the host name, ``%d`` its domain, ``%p`` the full node name,
``%i``/``%I`` the pool process index (always the main process here: ``0`` and ``""``)
and ``%%``.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click

from pyrula.cli.render import CliError, CliUsageError
from pyrula.workflows.inspection import DEFAULT_NODE

F = TypeVar("F", bound=Callable[..., Any])

DETACHED_ENV = "PYRULA_DETACHED"
"""Set in the environment of the process ``--detach`` starts, which then serves in place
(its command line still says ``--detach``)."""


def node_name(spec: str | None) -> str:
    """``-n/--hostname`` expanded as Celery does: ``%h`` the host name, ``%n`` its first
    label, ``%d`` its domain; a name without ``@`` gets ``@`` and the host name. None: the
    default ``celery@HOST``."""
    host = socket.gethostname()
    name, _, domain = host.partition(".")
    text = spec or f"{DEFAULT_NODE}@%h"
    expanded = _expand(text, {"h": host, "n": name, "d": domain})
    return expanded if "@" in expanded else f"{expanded}@{host}"


def expand_path(path: str, node: str) -> str:
    """A ``--logfile``/``--pidfile`` name with ``%n %h %d %p %i %I %%`` expanded for
    ``node`` (a full node name, ``name@host``)."""
    name, _, host = node.partition("@")
    domain = host.partition(".")[2]
    return _expand(path, {"n": name, "h": host, "d": domain, "p": node, "i": "0", "I": ""})


def _expand(text: str, values: Mapping[str, str]) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == "%" and i + 1 < len(text):
            key = text[i + 1]
            if key == "%":
                out.append("%")
                i += 2
                continue
            if key in values:
                out.append(values[key])
                i += 2
                continue
        out.append(char)
        i += 1
    return "".join(out)


def daemon_options(command: F) -> F:
    """Add Celery's daemon options to a click command (see the module docstring)."""
    options = [
        click.option("--logfile", "-f", "logfile", metavar="FILE", default=None,
                     help="Write log records to FILE (appended) instead of stderr. "
                     "%n, %h, %p, %i and %I expand as in Celery."),
        click.option("--pidfile", "pidfile", metavar="FILE", default=None,
                     help="Write the process id to FILE, removed at exit; refuse to start "
                     "while FILE names a live process."),
        click.option("--detach", "-D", "detach", is_flag=True, default=False,
                     help="Run in the background (a new session, standard streams on "
                     "/dev/null); the command returns at once."),
        click.option("--uid", "uid", metavar="USER", default=None,
                     help="Run as this user (name or id) once started."),
        click.option("--gid", "gid", metavar="GROUP", default=None,
                     help="Run with this group (name or id) once started."),
        click.option("--umask", "umask", metavar="OCTAL", default=None,
                     help="The process's umask, in octal (e.g. 022)."),
        click.option("--workdir", "workdir", metavar="DIR", default=None,
                     help="Change to DIR before anything else (modules are imported "
                     "from it)."),
        click.option("--executable", "executable", metavar="PYTHON", default=None,
                     help="With --detach: the Python interpreter that runs the "
                     "background process (default: this one)."),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


@dataclass(frozen=True)
class Daemon:
    """The daemon options given to one command."""

    logfile: str | None = None
    pidfile: str | None = None
    detach: bool = False
    uid: int | None = None
    gid: int | None = None
    umask: int | None = None
    workdir: str | None = None
    executable: str | None = None
    origin: str = field(default_factory=os.getcwd)
    """The directory the command started in (``--workdir`` is relative to it)."""

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> Daemon:
        """The options out of a command's parsed values, checked: a bad umask or an
        unknown user or group is a usage error."""
        umask = values.get("umask")
        if umask is not None:
            try:
                umask = int(str(umask), 8)
            except ValueError:
                raise CliUsageError(
                    f"--umask {values['umask']!r}: give an octal number such as 022"
                ) from None
        return cls(
            logfile=values.get("logfile") or None,
            pidfile=values.get("pidfile") or None,
            detach=bool(values.get("detach")) and not os.environ.get(DETACHED_ENV),
            uid=_user_id(values.get("uid")),
            gid=_group_id(values.get("gid")),
            umask=umask,
            workdir=values.get("workdir") or None,
            executable=values.get("executable") or None,
        )

    def enter_workdir(self) -> None:
        """Apply ``--umask`` and ``--workdir``: before the app or modules are imported."""
        if self.umask is not None:
            os.umask(self.umask)
        if self.workdir is not None:
            try:
                os.chdir(self.workdir)
            except OSError as exc:
                raise CliUsageError(f"--workdir {self.workdir}: {exc.strerror}") from None
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())

    def start_detached(self, node: str) -> None:
        """Start this command again in the background and return (the caller exits 0).

        The new process runs the same command line with :data:`DETACHED_ENV` set, in a
        new session (it applies ``--workdir``, ``--umask``, the pid file and
        ``--uid``/``--gid`` itself, as a foreground one does); its output goes to the log
        file if one is given, else to ``/dev/null``. A pid file naming a live process is
        reported here, in the foreground."""
        if self.pidfile:
            check_pidfile(expand_path(self.pidfile, node))
        env = dict(os.environ, **{DETACHED_ENV: "1"})
        argv = [self.executable or sys.executable, "-m", "pyrula.cli.main", *sys.argv[1:]]
        log_path = expand_path(self.logfile, node) if self.logfile else None
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            subprocess.Popen(  # our own command line, run again
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                close_fds=True,
                cwd=self.origin,  # where its command line's relative paths start
            )
        except OSError as exc:
            raise CliError(f"--detach: cannot start {argv[0]}: {exc}") from None
        finally:
            if log_path:
                out.close()  # type: ignore[union-attr]

    def drop_privileges(self) -> None:
        """Become ``--gid`` and ``--uid`` (group first: a user can no longer change it)."""
        if (self.uid is None or os.getuid() == self.uid) and (
            self.gid is None or os.getgid() == self.gid
        ):
            return
        try:
            if self.gid is not None:
                os.setgroups([self.gid])
                os.setgid(self.gid)
            if self.uid is not None:
                if self.gid is None:
                    user_gid = pwd.getpwuid(self.uid).pw_gid
                    os.setgroups([user_gid])
                    os.setgid(user_gid)
                os.setuid(self.uid)
        except (PermissionError, KeyError) as exc:
            raise CliError(f"--uid/--gid: cannot switch user or group: {exc}") from None

    @contextmanager
    def running(self, node: str) -> Iterator[None]:
        """Around the serving process: privileges dropped, then the pid file written (as
        the user it runs as, as Celery does: that user can remove it at exit) and removed
        at exit."""
        self.drop_privileges()
        pidfile = expand_path(self.pidfile, node) if self.pidfile else None
        if pidfile:
            write_pidfile(pidfile)
        try:
            yield
        finally:
            if pidfile:
                remove_pidfile(pidfile)

    def log_path(self, node: str) -> str | None:
        return expand_path(self.logfile, node) if self.logfile else None


def _user_id(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    if str(value).isdigit():
        return int(value)
    try:
        return pwd.getpwnam(value).pw_uid
    except KeyError:
        raise CliUsageError(f"--uid {value}: no such user") from None


def _group_id(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    if str(value).isdigit():
        return int(value)
    try:
        return grp.getgrnam(value).gr_gid
    except KeyError:
        raise CliUsageError(f"--gid {value}: no such group") from None


def check_pidfile(path: str) -> None:
    """Raise if ``path`` names a live process (another instance runs)."""
    pid = read_pid(path)
    if pid is not None and pid != os.getpid() and pid_running(pid):
        raise CliError(
            f"pidfile {path} names a live process: pyrula is already running (pid {pid}); "
            "stop it, or remove the file if that process is not pyrula"
        )


def write_pidfile(path: str) -> None:
    """Write this process's id to ``path``, created exclusively. A file naming a live
    process is an error (another instance runs); one naming a dead process, or holding
    no pid, is stale and replaced."""
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            check_pidfile(path)
            with suppress(FileNotFoundError):
                os.unlink(path)  # stale
            continue
        except OSError as exc:
            raise CliError(f"cannot create pidfile {path}: {exc.strerror}") from None
        with os.fdopen(fd, "w") as handle:
            handle.write(f"{os.getpid()}\n")
        return
    raise CliError(f"cannot create pidfile {path}: another process keeps creating it")


def remove_pidfile(path: str) -> None:
    """Remove ``path`` if it still holds this process's id."""
    if read_pid(path) == os.getpid():
        with suppress(FileNotFoundError):
            os.unlink(path)


def read_pid(path: str) -> int | None:
    """The process id a pid file holds (None: no file, or no id in it)."""
    try:
        with open(path) as handle:
            text = handle.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def pid_running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie, exited but not yet
    reaped, has)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError as exc:
        return exc.errno != errno.ESRCH
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True  # no /proc (not Linux): kill(pid, 0) said it exists
    return state not in ("Z", "X")
