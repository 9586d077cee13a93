"""Stamping (``Signature.stamp``, Celery 5.3's): custom headers set on a signature and,
through a canvas, on every signature in it and on their callbacks and errbacks.

``sig.stamp(visitor=None, append_stamps=False, **headers)`` sets each header as an
option and lists the names in the option ``stamped_headers``; a ``StampingVisitor``
decides per signature (``on_signature``), per chain, group, chord header and body, and
per callback and errback what else to stamp. A header stamped twice keeps the last
value, or with ``append_stamps`` a list of every value. The rules, the visitor's calls
and their order are Celery 5.7's.
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from copy import deepcopy
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyrula_compat.canvas import Signature


class StampingVisitor(metaclass=ABCMeta):
    """What to stamp, asked at each part of a canvas: each method returns the headers
    to add there (``on_signature`` must be defined; the others add nothing)."""

    def on_group_start(self, group: Any, **headers: Any) -> dict[str, Any]:
        return {}

    def on_group_end(self, group: Any, **headers: Any) -> None:
        return None

    def on_chain_start(self, chain: Any, **headers: Any) -> dict[str, Any]:
        return {}

    def on_chain_end(self, chain: Any, **headers: Any) -> None:
        return None

    @abstractmethod
    def on_signature(self, sig: Any, **headers: Any) -> dict[str, Any]:
        """The headers to stamp on ``sig``, a task's signature."""

    def on_chord_header_start(self, sig: Any, **header: Any) -> dict[str, Any]:
        return self.on_group_start(sig.header, **header)

    def on_chord_header_end(self, sig: Any, **header: Any) -> None:
        self.on_group_end(sig.header, **header)

    def on_chord_body(self, sig: Any, **header: Any) -> dict[str, Any]:
        return {}

    def on_callback(self, callback: Any, **header: Any) -> dict[str, Any]:
        return {}

    def on_errback(self, errback: Any, **header: Any) -> dict[str, Any]:
        return {}


def merge(into: dict[str, Any], other: dict[str, Any] | None, aggregate: bool) -> None:
    """Merge ``other`` into ``into``, dicts recursively; a key in both becomes a list of
    both values with ``aggregate`` (lists are extended), else ``into``'s value stays
    (a list is still extended by a list)."""
    if not other:
        return
    for key, value in into.items():
        if key not in other:
            continue
        if isinstance(value, dict):
            merge(value, other[key], aggregate)
            continue
        if isinstance(value, int | float | str):
            into[key] = [value] if aggregate else value
        if isinstance(other[key], list) and isinstance(into[key], list):
            into[key].extend(other[key])
        elif aggregate:
            into[key] = [] if into[key] is None else list(into[key])
            into[key].append(other[key])
    for key, value in other.items():
        into.setdefault(key, value)


def stamp_headers(
    sig: Signature,
    visitor_headers: dict[str, Any] | None = None,
    append_stamps: bool = False,
    self_headers: bool = True,
    **headers: Any,
) -> dict[str, Any]:
    """The stamps for ``sig``: ``headers``, the visitor's, and (with ``self_headers``)
    those ``sig`` has already, with ``stamped_headers`` naming them all."""
    headers = dict(headers)
    headers.setdefault("stamped_headers", list(headers))
    if visitor_headers is not None:
        visitor_headers = dict(visitor_headers)
        visitor_headers.setdefault("stamped_headers", list(visitor_headers))
        merge(headers, visitor_headers, append_stamps)
        headers["stamped_headers"] = list(set(headers["stamped_headers"]))
    if self_headers:
        names = set(headers.get("stamped_headers", []))
        names.update(sig.options.get("stamped_headers", []))
        headers["stamped_headers"] = list(names)
        own = {k: v for k, v in sig.options.items() if k in headers["stamped_headers"]}
        merge(headers, own, append_stamps)
        headers["stamped_headers"] = list(set(headers["stamped_headers"]))
    return headers


def stamp_signature(
    sig: Signature, visitor: StampingVisitor | None, append_stamps: bool, **headers: Any
) -> Signature:
    """``Signature.stamp`` of a task's signature: its links, then itself."""
    stamp_links(sig, visitor, append_stamps, **headers)
    visitor_headers = visitor.on_signature(sig, **headers) or {} if visitor else None
    return sig.set(**stamp_headers(sig, visitor_headers, append_stamps, **headers))


def stamp_links(
    sig: Signature, visitor: StampingVisitor | None, append_stamps: bool, **headers: Any
) -> None:
    """Stamp ``sig``'s callbacks and errbacks with ``headers`` and what the visitor's
    ``on_callback``/``on_errback`` add (not with ``sig``'s own stamps)."""
    from pyrula_compat.canvas import maybe_signature

    for option, ask in (("link", "on_callback"), ("link_error", "on_errback")):
        linked_headers = deepcopy(headers)
        links = sig.options.get(option) or []
        for index, item in enumerate(links if isinstance(links, list) else [links]):
            link = maybe_signature(item, app=sig._app)
            if link is None:
                continue
            if isinstance(links, list):
                links[index] = link  # a dict becomes the signature it stamps
            extra = getattr(visitor, ask)(link, **linked_headers) or {} if visitor else None
            linked_headers = stamp_headers(
                link, extra, append_stamps, self_headers=False, **linked_headers
            )
            link.stamp(visitor, append_stamps, **linked_headers)


def stamp_members(
    owner: Signature,
    members: list[Signature],
    visitor: StampingVisitor | None,
    append_stamps: bool,
    start: str,
    end: str,
    links_append: bool | None = None,
    **headers: Any,
) -> dict[str, Any]:
    """Stamp a chain's, group's or chord header's members, between the visitor's
    ``start`` and ``end`` calls; return the headers they got. (Celery stamps a chain's
    own links without ``append_stamps``: ``links_append=False``.)"""
    visitor_headers = getattr(visitor, start)(owner, **headers) or {} if visitor else None
    headers = stamp_headers(owner, visitor_headers, append_stamps, **headers)
    append_links = append_stamps if links_append is None else links_append
    stamp_links(owner, visitor, append_links, **headers)
    for member in members:
        member.stamp(visitor, append_stamps, **headers)
    if visitor is not None:
        getattr(visitor, end)(owner, **headers)
    return headers


__all__ = ["StampingVisitor"]
