"""A Celery broker on Redis or Valkey, as kombu's Redis transport lays it out, read and
taken from one message at a time.

Layout (kombu ``transport/redis.py``; every key behind the transport's
``global_keyprefix``, empty by default):

* a queue is a list named after it; a producer ``LPUSH``es, a worker ``BRPOP``s, so the
  oldest message is at the tail. Priorities other than 0 live in sibling lists named
  ``<queue>\\x06\\x16<priority>`` (Celery's default steps: 0, 3, 6, 9; 0 is taken first);
* ``_kombu.binding.<exchange>`` sets list the queues declared on each exchange
  (``routing_key\\x06\\x16pattern\\x06\\x16queue``);
* a message a worker has taken but not acknowledged (prefetched, or waiting for its eta)
  is in the ``unacked`` hash (delivery tag → ``[message, exchange, routing_key]``), with
  the time it was taken in the ``unacked_index`` sorted set.

Taking a message is one Lua call that removes it from where it is and appends it to this
adoption's own list, ``pyrula.adopting`` (so a Celery worker ``BRPOP``ing the same queue
and this command never both get it), and the message leaves that list only once its run
is stored: a run killed in between finds it there and finishes it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

SEP = "\x06\x16"
ADOPTING = "pyrula.adopting"
"""The list of messages taken from Celery whose runs may not be stored yet (behind the
transport's key prefix, as the queues are)."""
SCHEMES = ("redis", "rediss", "valkey", "valkeys", "unix")

_TAKE_QUEUED = """
if redis.call('LREM', KEYS[1], -1, ARGV[1]) == 1 then
  redis.call('LPUSH', KEYS[2], ARGV[2])
  return 1
end
return 0
"""
"""Remove one copy of the message from its queue (searching from the tail, where the
oldest are) and, only if it was still there, put it on the adoption list."""

_TAKE_UNACKED = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('LPUSH', KEYS[3], ARGV[2])
return 1
"""
"""Take a reserved message out of ``unacked`` (and its index) onto the adoption list,
unless its worker acknowledged it, or a restore put it back in its queue, meanwhile."""


class BrokerUrlError(ValueError):
    """The ``--from`` URL is not a Celery broker this command can read."""


@dataclass(frozen=True)
class Held:
    """A message as it sits in the broker: ``source`` is its queue's list (``queue`` and
    ``priority`` read from the key), or the ``unacked`` hash (``tag`` its delivery tag)."""

    raw: str
    source: str
    queue: str
    priority: int = 0
    tag: str | None = None

    def entry(self) -> str:
        """Its line on the adoption list: enough to adopt it after a crash."""
        return json.dumps([self.source, self.queue, self.priority, self.tag, self.raw])

    @classmethod
    def from_entry(cls, entry: str) -> Held:
        source, queue, priority, tag, raw = json.loads(entry)
        return cls(raw=raw, source=source, queue=queue, priority=priority, tag=tag)


def check_url(url: str) -> None:
    scheme = urlsplit(url).scheme.lower()
    if scheme not in SCHEMES:
        raise BrokerUrlError(
            f"--from {scheme or url!r}: only a Celery broker on Redis or Valkey can be adopted "
            f"(redis://, rediss://, valkey://, unix://); for another broker, drain it with "
            "Celery's own workers while pyrula serves new work"
        )


class CeleryBroker:
    """The old broker, through a plain synchronous valkey-py client."""

    def __init__(self, url: str, *, key_prefix: str = "") -> None:
        check_url(url)
        import valkey

        self.prefix = key_prefix
        self.client: Any = valkey.Valkey.from_url(url)
        self.adoption_list = self.key(ADOPTING)
        self._take_queued = self.client.register_script(_TAKE_QUEUED)
        self._take_unacked = self.client.register_script(_TAKE_UNACKED)

    def close(self) -> None:
        self.client.close()

    def key(self, name: str) -> str:
        return self.prefix + name

    # -- what is there ------------------------------------------------------------------
    def declared_queues(self) -> set[str]:
        """Queue names kombu's bindings record (every exchange)."""
        names: set[str] = set()
        for key in self.client.scan_iter(match=self._glob(self.key("_kombu.binding.")) + "*"):
            for member in self.client.smembers(key):
                parts = member.decode("utf-8", "replace").split(SEP)
                if len(parts) == 3 and parts[2]:
                    names.add(parts[2])
        return names

    def queue_keys(self, queue: str) -> list[tuple[str, int]]:
        """The lists holding ``queue``'s messages, priority 0 first, with their priority."""
        base = self.key(queue)
        keys = [(base, 0)]
        for key in self.client.scan_iter(match=self._glob(base + SEP) + "*"):
            suffix = key.decode("utf-8", "replace")[len(base) + len(SEP) :]
            if suffix.isdigit():
                keys.append((key.decode(), int(suffix)))
        return sorted(keys, key=lambda pair: pair[1])

    def depth(self, key: str) -> int:
        return int(self.client.llen(key))

    def oldest(self, key: str, skip: int, count: int) -> list[str]:
        """Up to ``count`` messages of a queue list, oldest first, past the ``skip``
        oldest."""
        items = self.client.lrange(key, -(skip + count), -(skip + 1))
        return [item.decode("utf-8") for item in reversed(items)]

    def unacked(self) -> Iterator[tuple[str, float, str, str]]:
        """Reserved messages: (delivery tag, when taken, exchange routing key, message)."""
        index = self.key("unacked_index")
        for tag, score in self.client.zscan_iter(index):
            raw = self.client.hget(self.key("unacked"), tag)
            if raw is None:
                continue
            try:
                message, _exchange, routing_key = json.loads(raw)
            except (ValueError, TypeError):
                message, routing_key = None, ""
            yield tag.decode(), float(score), str(routing_key or ""), json.dumps(message)

    def adopting(self) -> list[Held]:
        """Messages taken by an earlier adoption that did not finish (oldest first)."""
        entries = self.client.lrange(self.adoption_list, 0, -1)
        return [Held.from_entry(entry.decode()) for entry in reversed(entries)]

    # -- taking -------------------------------------------------------------------------
    def take(self, held: Held) -> bool:
        """Move the message onto the adoption list; False if someone else took it."""
        if held.tag is not None:
            keys = [self.key("unacked"), self.key("unacked_index"), self.adoption_list]
            return bool(self._take_unacked(keys=keys, args=[held.tag, held.entry()]))
        keys = [held.source, self.adoption_list]
        return bool(self._take_queued(keys=keys, args=[held.raw, held.entry()]))

    def done(self, held: Held) -> None:
        """The run is stored: the message leaves the broker for good."""
        self.client.lrem(self.adoption_list, 1, held.entry())

    @staticmethod
    def _glob(text: str) -> str:
        return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)
