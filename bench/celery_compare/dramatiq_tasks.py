"""The benchmark's sample tasks, written for Dramatiq (its Redis broker and Redis results
on the same Valkey server, from ``BENCH_VALKEY_URL``); the same four as
``celery_tasks.py``. Every setting is Dramatiq's default except result storage, which
the round trips and chains need."""

import os
import time

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

URL = os.environ.get("BENCH_VALKEY_URL", "redis://127.0.0.1:6379/0")

broker = RedisBroker(url=URL)
backend = RedisBackend(url=URL)
broker.add_middleware(Results(backend=backend))
broker.add_middleware(CurrentMessage())
dramatiq.set_broker(broker)


@dramatiq.actor(store_results=True)
def noop():
    """Nothing: all of its cost is the system's."""
    return None


@dramatiq.actor(store_results=True)
def add(x, y):
    """The link of the three-task chains (``pipeline`` appends the previous result)."""
    return x + y


@dramatiq.actor(store_results=True, max_retries=1)
def fail_once():
    """Fails on its first attempt, asks to be retried at once, succeeds on the retry."""
    message = CurrentMessage.get_current_message()
    retries = message.options.get("retries", 0) if message is not None else 0
    if retries == 0:
        raise dramatiq.Retry("first attempt fails", delay=0)
    return retries


@dramatiq.actor(store_results=True)
def stamp():
    """When the body started, for countdown lateness (epoch seconds)."""
    return time.time()
