"""Calls ``celery.utils.{time,functional,imports}`` helpers the same way on Celery and on
``pyrula_compat`` and prints what they return as JSON: ``test_utils_helpers.py`` runs it
under both and compares. ``python helpers_probe.py celery`` (with Celery on the path)."""

from __future__ import annotations

import importlib
import json
import sys
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo


def probe(pkg: str) -> dict[str, Any]:
    t = importlib.import_module(f"{pkg}.utils.time")
    f = importlib.import_module(f"{pkg}.utils.functional")
    i = importlib.import_module(f"{pkg}.utils.imports")
    paris = ZoneInfo("Europe/Paris")
    start = datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)
    out: dict[str, Any] = {
        "humanize": [
            t.humanize_seconds(s, *a)
            for s, a in [
                (0, ()),
                (1, ()),
                (60, ()),
                (61.5, ()),
                (7200, ("in", " ")),
                (86400 * 3, ()),
                (0.25, ()),
            ]
        ]
        + [t.humanize_seconds(0.25, microseconds=True)],
        "rate": [t.rate(r) for r in ["100/m", "2/h", "0.5/s", "10", "", None, 5]],
        "weekday": [t.weekday(n) for n in ["sunday", "sun", "Mon", "saturday"]],
        "delta_resolution": [
            str(t.delta_resolution(datetime(2024, 1, 2, 5, 6, 7, 8), timedelta(seconds=s)))
            for s in (1, 60, 3600, 86400, 7 * 86400)
        ],
        "is_naive": [t.is_naive(datetime(2024, 1, 1)), t.is_naive(start)],
        "make_aware_gap": str(t.make_aware(datetime(2024, 3, 31, 2, 30), paris)),
        "make_aware_fold": str(t.make_aware(datetime(2024, 10, 27, 2, 30), paris)),
        "make_aware_plain": str(t.make_aware(datetime(2024, 6, 1, 12, 0), paris)),
        "localize": str(t.localize(start, paris)),
        "to_utc": str(t.to_utc(datetime(2024, 1, 1, 3))),
        "maybe_make_aware": [
            str(t.maybe_make_aware(datetime(2024, 1, 1, 3))),
            str(t.maybe_make_aware(datetime(2024, 1, 1, 3), paris)),
            str(t.maybe_make_aware(start)),
        ],
        "add_seconds": [
            str(t.add_seconds_to_datetime(datetime(2024, 3, 31, 1, 30, tzinfo=paris), 3600)),
            str(t.add_seconds_to_datetime(datetime(2024, 1, 1), 90)),
        ],
        "subtract": str(t.subtract_datetimes(start, datetime(2024, 5, 1, 9))),
        "remaining": str(t.remaining(start, timedelta(seconds=90), now=start)),
        "remaining_past": str(t.remaining(start, timedelta(seconds=30), now=start + timedelta(60))),
        "remaining_relative": [
            str(
                t.remaining(
                    start + timedelta(seconds=s), timedelta(seconds=e), now=start + n, relative=True
                )
            )
            for s, e, n in [
                (30, 60, timedelta(seconds=40)),
                (30, 3600, timedelta(minutes=5)),
                (30, 86400, timedelta(minutes=5)),
                (0, 300, timedelta(minutes=1)),
                (3599, 60, timedelta(seconds=3599)),
            ]
        ],
        "iso": [
            str(t.maybe_iso8601(s))
            for s in ["2024-01-02T03:04:05Z", "2024-01-02T03:04:05.123456+02:00", None]
        ],
        "ffwd": [
            str(datetime(2024, 1, 31, 10) + t.ffwd(month=2)),
            str(datetime(2024, 1, 31, 10) + t.ffwd(hour=3, minute=0, weekday=0)),
            str(datetime(2024, 1, 1) + t.ffwd(weeks=2, day=5)),
            repr(t.ffwd(day=1, hour=2)),
        ],
        "backoff": [t.get_exponential_backoff_interval(2, r, 100) for r in range(8)],
        "maybe_timedelta": [str(t.maybe_timedelta(30)), str(t.maybe_timedelta(None))],
        "adjust_timestamp": t.adjust_timestamp(1000.0, 2.0, here=lambda: 1.0),
        "utcoffset": t.utcoffset(),
        "timezone": [
            str(t.timezone.utc),
            str(t.timezone.get_timezone("Asia/Tokyo")),
            str(t.timezone.to_local(datetime(2024, 1, 1, 12), "Asia/Tokyo")),
        ],
    }
    lru = f.LRUCache(limit=2)
    lru["a"], lru["b"] = 1, 2
    _ = lru["a"]
    lru["c"] = 3
    calls: list[int] = []

    @f.memoize(maxsize=2)
    def square(x: int) -> int:
        calls.append(x)
        return x * x

    squares = [square(2), square(2), square(3), square(4), square(2)]
    regen = f.regen(iter(range(5)))
    lazy_count: list[int] = []
    once = f.mlazy(lambda: lazy_count.append(1) or len(lazy_count))
    out.update(
        {
            "lru": sorted(lru.keys()),
            "memoize": [squares, calls, square.hits, square.misses],
            "chunks": list(f.chunks(iter(range(7)), 3)),
            "padlist": [f.padlist(["a", "b"], 3), f.padlist([1, 2, 3, 4], 2, default=0)],
            "uniq": list(f.uniq([3, 1, 3, 2, 1])),
            "first": [
                f.first(None, [None, 0, 1]),
                f.first(lambda v: v > 1, [1, 2, 3]),
                f.first(None, [None]),
            ],
            "firstmethod": f.firstmethod("get")([{}, {"k": "v"}], "k"),
            "mattrgetter": f.mattrgetter("real", "nope")(3),
            "is_list": [f.is_list(x) for x in ([1], (1,), "s", {"a": 1}, 3, iter([]))],
            "maybe_list": [f.maybe_list(1), f.maybe_list([1]), f.maybe_list(None)],
            "dictfilter": [f.dictfilter({"a": None, "b": 1}, c=None, e=2), f.dictfilter(x=None)],
            "maybe": [f.maybe(int, "3"), f.maybe(int, None)],
            "regen": [regen[3], list(regen), list(regen), len(regen), bool(f.regen(iter([])))],
            "lazy": [f.lazy(lambda a, b: a + b, 1, 2)(), once(), once(), lazy_count],
            "maybe_evaluate": [f.maybe_evaluate(f.lazy(lambda: 5)), f.maybe_evaluate(6)],
            "noop": f.noop(1, x=2),
            "fun_accepts_kwargs": [
                f.fun_accepts_kwargs(lambda **kw: 1),
                f.fun_accepts_kwargs(lambda a: 1),
            ],
        }
    )

    def target(a: int, b: int = 2, *args: Any, c: int, **kwargs: Any) -> None: ...

    head = f.head_from_fun(target)
    verdicts = []
    for args, kwargs in [
        ((1,), {"c": 3}),
        ((), {"c": 3}),
        ((1, 2, 3, 4), {"c": 1, "z": 2}),
        ((1,), {}),
    ]:
        try:
            verdicts.append(head(*args, **kwargs))
        except TypeError:
            verdicts.append("TypeError")
    out["head_from_fun"] = verdicts
    out["imports"] = {
        "symbol": [
            i.symbol_by_name("json:dumps").__name__,
            i.symbol_by_name("json.loads").__name__,
            i.symbol_by_name("os.path").__name__,
            i.symbol_by_name(len).__name__,
            i.symbol_by_name("json:nope", default="d"),
            i.symbol_by_name("short", aliases={"short": "json:dumps"}).__name__,
        ],
        "instantiate": i.instantiate("collections:OrderedDict", [("a", 1)]),
        "qualname": [
            i.qualname(datetime),
            i.qualname(datetime(2024, 1, 1)),
            i.qualname(json.dumps),
            i.qualname(timedelta.total_seconds),
        ],
        "module_file": i.module_file(json).endswith("__init__.py"),
        "find_module": i.find_module("json.decoder").__name__,
    }
    try:
        i.find_module("json.decoder.nothing")
    except Exception as exc:
        out["imports"]["find_module_error"] = type(exc).__name__
    try:
        i.symbol_by_name("json:nope")
    except AttributeError:
        out["imports"]["missing_attr"] = "AttributeError"
    try:
        i.symbol_by_name("no_such_module_x:thing")
    except ImportError:
        out["imports"]["missing_module"] = "ImportError"

    class App:
        main = "proj"

    out["imports"]["gen_task_name"] = [
        i.gen_task_name(App(), "add", "__main__"),
        i.gen_task_name(App(), "add", "proj.tasks"),
        i.gen_task_name(App(), "add", "json"),
    ]
    return out


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1]), sort_keys=True, default=str))
