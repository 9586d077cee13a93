"""Which workers a Celery destination names (``-d``/``destination=``): ids, hostnames,
and node names ``NAME@HOST``, for workers started with and without ``-n``."""

from __future__ import annotations

from pyrula.workflows.inspection import destinations, matches
from pyrula.workflows.records import WorkerInfo


def worker(worker_id: str, hostname: str = "box") -> WorkerInfo:
    return WorkerInfo(
        worker_id=worker_id, workflows=(), hostname=hostname, pid=1, started_at=0.0,
        last_seen=0.0, running=0,
    )  # fmt: skip


DEFAULT = worker("box-4242-a1b2c3")
W1 = worker("w1@box-4243-d4e5f6")
W1_AGAIN = worker("w1@box-4300-0a0b0c")  # restarted: a new id, the same node
W10 = worker("w10@box-4244-123456")
ELSEWHERE = worker("other-9-ffffff", hostname="other")


def picked(destination: str) -> list[str]:
    names = destinations(destination)
    everyone = [DEFAULT, W1, W1_AGAIN, W10, ELSEWHERE]
    return [w.worker_id for w in everyone if matches(w, names)]


def test_a_node_name_picks_the_workers_started_under_it() -> None:
    assert picked("w1@box") == [W1.worker_id, W1_AGAIN.worker_id]  # not w10@box
    assert picked("w10@box") == [W10.worker_id]
    assert picked("w2@box") == []  # nor the default worker: its node is celery@box


def test_the_default_node_name_picks_the_hosts_workers_without_a_node_name() -> None:
    assert picked("celery@box") == [DEFAULT.worker_id]
    assert picked("celery@other") == [ELSEWHERE.worker_id]


def test_ids_hostnames_and_lists() -> None:
    assert picked(W1.worker_id) == [W1.worker_id]
    assert picked("box") == [DEFAULT.worker_id, W1.worker_id, W1_AGAIN.worker_id, W10.worker_id]
    assert picked("w10@box, celery@other") == [W10.worker_id, ELSEWHERE.worker_id]
    assert picked("") == [w.worker_id for w in [DEFAULT, W1, W1_AGAIN, W10, ELSEWHERE]]
    assert matches(W1, ("",)) is False  # a blank name (an unset $HOSTNAME) matches none
