"""The nodes of ``pyrula multi``: Celery's ``celery multi`` arguments, parsed as it does.

``start w1 w2 -c 3 -c:w1 4`` names the nodes (``w1@HOST``, ``w2@HOST``; a lone number
``N`` names ``celery1`` .. ``celeryN``) and gives options to every node's ``pyrula worker``
command, ``-X:SELECTOR value`` (``--long:SELECTOR=value``) to some of them: a SELECTOR is
a comma-separated list of node names (``w1`` or ``w1@HOST``), 1-based indexes (``2``) and
index ranges (``1-3``). A node's own option replaces the option given to all.

Option values expand Celery's multi placeholders for each node before the worker sees
them: ``%n`` (and ``%N``) the node's name before the ``@``, ``%h`` and ``%p`` the full node
name, ``%d`` the part after the ``@``; ``%i``, ``%I`` and ``%%`` are left for the worker.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import click

from pyrula.cli.daemon import expand_path, node_name
from pyrula.cli.render import CliUsageError

RANGE_PREFIX = "celery"
"""The name of numbered nodes (``start 3``: ``celery1`` .. ``celery3``), as in Celery."""
DEFAULT_PIDFILE = "%n.pid"
DEFAULT_LOGFILE = "%n%I.log"
RESERVED_FLAGS = {
    "--nosplash": "nosplash",
    "--quiet": "quiet",
    "-q": "quiet",
    "--verbose": "verbose",
    "--no-color": "no_color",
}
"""``celery multi``'s own flags, taken out wherever they are (never given to workers)."""
RESERVED_VALUES = {
    "--hostname": "hostname",
    "-n": "hostname",
    "--prefix": "prefix",
    "--suffix": "suffix",
    "--range-prefix": "range_prefix",
    "--append": "append",
    "--cmd": "cmd",
}
"""``celery multi``'s own options with a value."""
ALIASES = {"-p": "--pidfile"}
"""Options ``celery multi`` knows under another name than the worker does."""
NOT_PASSED = frozenset({"detach", "celery_hostname", "pidfile", "logfile"})
"""Worker options multi sets itself (``-D``, ``-n``) or puts first (the files)."""
_SIGNAL = re.compile(r"-(\d+|(?:SIG)?[A-Z][A-Z0-9]+)$")


@dataclass(frozen=True)
class KnownOption:
    """What the parser needs to know of one ``pyrula worker`` option."""

    key: str
    takes_value: bool
    multiple: bool


def worker_options() -> dict[str, KnownOption]:
    """Every option string of ``pyrula worker`` (``-c``, ``--concurrency``, ...)."""
    from pyrula.cli.worker import worker_command

    known: dict[str, KnownOption] = {}
    for param in worker_command.params:
        if isinstance(param, click.Option):
            spec = KnownOption(str(param.name), not param.is_flag, bool(param.multiple))
            for opt in (*param.opts, *param.secondary_opts):
                known[opt] = spec
    return known


@dataclass(frozen=True)
class Opt:
    """One option as given: ``flag`` as written, ``key`` the worker parameter it sets (the
    flag itself for an option the worker does not know), ``value`` None for a flag."""

    flag: str
    key: str
    value: str | None
    multiple: bool = False

    def words(self, expand: Mapping[str, str]) -> list[str]:
        """The option on a command line: ``--long=value``, ``-s value``, ``-f``."""
        if self.value is None:
            return [self.flag]
        value = expand_node(self.value, expand)
        return [f"{self.flag}={value}"] if self.flag.startswith("--") else [self.flag, value]


@dataclass
class MultiArgs:
    """The arguments after the sub-command."""

    names: list[str] = field(default_factory=list)
    options: list[Opt] = field(default_factory=list)
    per_node: list[tuple[str, Opt]] = field(default_factory=list)
    reserved: dict[str, str] = field(default_factory=dict)
    flags: set[str] = field(default_factory=set)
    signal: int | None = None
    passthrough: list[str] = field(default_factory=list)


def signal_number(arg: str) -> int | None:
    """``-9``, ``-KILL``, ``-SIGHUP``: the signal; None if ``arg`` names none."""
    match = _SIGNAL.match(arg)
    if match is None:
        return None
    text = match.group(1)
    if text.isdigit():
        number = int(text)
        return number if 0 < number < signal.NSIG else None
    name = text if text.startswith("SIG") else f"SIG{text}"
    found = getattr(signal, name, None)
    return int(found) if isinstance(found, signal.Signals) else None


def parse_args(args: Sequence[str], known: Mapping[str, KnownOption]) -> MultiArgs:
    """Celery's ``NamespacedOptionParser``: node names, options for all, options for some.

    As in Celery, ``--long=value`` carries its value and a short option takes the next
    word unless that starts with ``-``; an option ``pyrula worker`` knows takes (or not)
    the next word as the worker would (``--loglevel INFO``, ``-D w2``)."""
    parsed = MultiArgs()
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            parsed.passthrough = list(args[i:])
            break
        if arg in RESERVED_FLAGS:
            parsed.flags.add(RESERVED_FLAGS[arg])
            continue
        if len(arg) < 2 or not arg.startswith("-"):
            parsed.names.append(arg)
            continue
        number = signal_number(arg)
        if number is not None:
            parsed.signal = number
            continue
        head, equals, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        flag, colon, selector = head.partition(":")
        flag = ALIASES.get(flag, flag)
        spec = known.get(flag)
        given: str | None = value if equals else None
        if given is None:
            if flag in RESERVED_VALUES or (spec is not None and spec.takes_value):
                if i >= len(args):
                    raise CliUsageError(f"{arg} needs a value")
                given = args[i]
                i += 1
            elif spec is None and not arg.startswith("--") and _a_value(args, i):
                given = args[i]  # Celery's rule for short options
                i += 1
        if flag in RESERVED_VALUES:
            if colon:
                raise CliUsageError(f"{arg}: {flag} applies to every node, not to some")
            parsed.reserved[RESERVED_VALUES[flag]] = given or ""
            continue
        opt = Opt(flag, spec.key if spec else flag, given, bool(spec and spec.multiple))
        if colon:
            if not selector:
                raise CliUsageError(f"{arg}: name the nodes after the colon ({flag}:w1)")
            parsed.per_node.append((selector, opt))
        else:
            parsed.options.append(opt)
    return parsed


def _a_value(args: Sequence[str], i: int) -> bool:
    return i < len(args) and not args[i].startswith("-")


def expand_node(text: str, values: Mapping[str, str]) -> str:
    """Celery multi's expansion of ``%x`` in an option value; ``%%`` and letters not in
    ``values`` (``%i``, ``%I``) stay for the worker."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "%" and i + 1 < len(text):
            key = text[i + 1]
            out.append(values.get(key, f"%{key}"))
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


@dataclass
class Node:
    """One worker of the cluster: its node name and the options of its command."""

    name: str
    short: str
    options: list[Opt]
    append: list[str] = field(default_factory=list)
    own: set[str] = field(default_factory=set)
    """The keys of the options given to this node itself."""

    @property
    def placeholders(self) -> dict[str, str]:
        host = self.name.partition("@")[2]
        return {"n": self.short, "N": self.short, "h": self.name, "d": host, "p": self.name}

    def expand(self, text: str) -> str:
        return expand_node(text, self.placeholders)

    def value(self, key: str) -> str | None:
        """The (last) value given for the worker parameter ``key``, expanded."""
        found = [o.value for o in self.options if o.key == key and o.value is not None]
        return self.expand(found[-1]) if found else None

    @property
    def workdir(self) -> str:
        return os.path.abspath(self.value("workdir") or ".")

    def path(self, key: str) -> str:
        """``--pidfile`` or ``--logfile`` as the worker will open it."""
        text = expand_path(self.value(key) or "", self.name)
        return os.path.join(self.workdir, text)

    @property
    def pidfile(self) -> str:
        return self.path("pidfile")

    @property
    def logfile(self) -> str:
        return self.path("logfile")

    @property
    def executable(self) -> str:
        return self.value("executable") or sys.executable

    def argv(self, app: str | None = None) -> list[str]:
        """The command that starts this node: ``pyrula worker -D -n NODE ...``; ``app``
        (``-A`` before ``multi``) unless the node's options name one."""
        words = [self.executable, "-m", "pyrula.cli.main", "worker", "-D", "-n", self.name]
        if app and self.value("celery_app") is None:
            words += ["-A", app]
        for key in ("pidfile", "logfile"):
            words.append(f"--{key}={self.value(key)}")
        values = self.placeholders
        for opt in self.options:
            if opt.key not in NOT_PASSED:
                words += opt.words(values)
        return words + [self.expand(word) for word in self.append]


def build_nodes(parsed: MultiArgs) -> list[Node]:
    """The nodes named by ``parsed``, each with its merged options (Celery's
    ``MultiParser``)."""
    if parsed.passthrough:
        raise CliUsageError(
            f"{' '.join(['--', *parsed.passthrough])}: settings after `--` are not "
            "supported; put them in the app's configuration"
        )
    if "cmd" in parsed.reserved:
        raise CliUsageError("--cmd: pyrula multi always runs `pyrula worker`")
    names, prefix = parsed.names, parsed.reserved.get("prefix", "")
    suffix = parsed.reserved.get("suffix") or parsed.reserved.get("hostname") or "%h"
    keys = list(names)
    if len(names) == 1 and names[0].isdigit():
        count = int(names[0])
        if count < 1:
            raise CliUsageError(f"{count} nodes: give a number of at least 1, or names")
        keys = [str(n) for n in range(1, count + 1)]
        prefix = parsed.reserved.get("range_prefix") or RANGE_PREFIX
    if not keys:
        raise CliUsageError("no nodes: give node names (w1 w2) or a number of nodes (3)")
    nodes: list[Node] = []
    aliases: list[set[str]] = []
    for key in keys:
        if "@" in key:
            full = node_name(key)
            short = full.partition("@")[0]
        else:
            short = prefix + key
            full = node_name(f"{short}@{suffix}")
        if any(node.name == full for node in nodes):
            raise CliUsageError(f"node {full} is named twice")
        append = shlex.split(parsed.reserved.get("append") or "")
        nodes.append(Node(full, short, list(parsed.options), append))
        aliases.append({key, short, full})
    for selector, opt in parsed.per_node:
        for index in select(selector, aliases, opt.flag):
            _override(nodes[index], opt)
    for node in nodes:
        for key, default in (("pidfile", DEFAULT_PIDFILE), ("logfile", DEFAULT_LOGFILE)):
            if node.value(key) is None:
                node.options.insert(0, Opt(f"--{key}", key, default))
    return nodes


def _override(node: Node, opt: Opt) -> None:
    """``opt`` given to this node replaces what was given to all (a repeatable option
    given twice to the node keeps both)."""
    if opt.key not in node.own or not opt.multiple:
        node.options = [o for o in node.options if o.key != opt.key]
    node.own.add(opt.key)
    node.options.append(opt)


def select(selector: str, aliases: Sequence[set[str]], flag: str) -> Iterable[int]:
    """The node indexes ``selector`` names: names, 1-based indexes, ranges ``1-3``."""
    count = len(aliases)
    chosen: list[int] = []
    for item in selector.split(","):
        named = [i for i, names in enumerate(aliases) if item in names]
        if named:
            chosen += named
            continue
        bounds = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if bounds is None:
            raise CliUsageError(
                f"{flag}:{selector}: no node named {item!r} "
                f"(nodes: {', '.join(sorted(min(n, key=len) for n in aliases))})"
            )
        first = int(bounds.group(1))
        last = int(bounds.group(2) or first)
        if not 1 <= first <= last <= count:
            raise CliUsageError(
                f"{flag}:{selector}: {item} is not a node index or range within 1-{count}"
            )
        chosen += range(first - 1, last)
    return chosen
