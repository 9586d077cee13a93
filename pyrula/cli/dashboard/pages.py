"""The dashboard's HTML: the page shell and the pieces every page is built from.

Every value from the store goes through :func:`html.escape`. A page is its shell (the
navigation, the forms that act) around one live region, ``<div id="live">``: the script
(``static/app.js``) keeps that region current over server-sent events
(``/api/live?path=...``), replacing it with the same HTML the server renders for the
page, so nothing reloads and a form being typed in is not touched. Without the script
every page still shows its data as of its load.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from html import escape
from typing import Any
from urllib.parse import quote

NAV = (
    ("/overview", "Overview", "o"),
    ("/", "Runs", "u"),
    ("/workers", "Workers", "w"),
    ("/queues", "Queues", "q"),
    ("/schedules", "Schedules", "s"),
    ("/owners", "Owners", "e"),
    ("/dead", "Dead letters", "d"),
)
"""Each page's path, its title and its key (pressed after ``g``)."""

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #222; }
header { background: #1f2d3d; color: #eee; padding: .5em 1.5em; }
header a { color: #cde; margin-right: 1em; text-decoration: none; }
header a.here { color: #fff; font-weight: bold; }
main { padding: 0 1.5em 2em; }
table { border-collapse: collapse; margin: .5em 0 1.5em; }
th, td { border-bottom: 1px solid #ddd; padding: .25em .6em; text-align: left;
         vertical-align: top; }
th { background: #f4f4f4; }
tr.sel { background: #fff6c8; }
pre { background: #f7f7f7; padding: .5em; overflow-x: auto; max-width: 100em; margin: 0; }
.s-completed { color: #17702a; } .s-failed, .s-dead, .s-terminated { color: #b00020; }
.s-running { color: #0b55b5; } .s-cancelled { color: #777; }
.muted { color: #777; } .err { color: #b00020; } .ok { color: #17702a; }
.counts a { margin-right: .8em; } .box { border: 1px solid #ddd; padding: .5em 1em;
  margin: .5em 0 1em; max-width: 60em; } .box h3 { margin: .2em 0 .4em; }
form.inline { display: inline; } textarea { width: 40em; height: 4em; font: 12px monospace; }
.charts { display: flex; flex-wrap: wrap; gap: 1.5em; } .charts figure { margin: 0; }
.msg { min-height: 1.4em; } kbd { border: 1px solid #bbb; border-radius: 3px;
  padding: 0 .3em; font-size: 12px; }
"""


@dataclass(frozen=True)
class Site:
    """What every page needs: the URL prefix, the store shown, the workflows known."""

    prefix: str = ""
    store: str = ""
    workflows: Mapping[str, Sequence[str] | None] = field(default_factory=dict)
    """Each workflow name, with its parameter names where its definition is imported."""
    live: bool = True

    def href(self, path: str) -> str:
        return self.prefix + path


def text(value: Any) -> str:
    """A cell: ``-`` for None, else the escaped text."""
    return "-" if value is None else escape(str(value))


def pre(value: Any) -> str:
    """A JSON value, pretty-printed and escaped, in a ``<pre>``."""
    shown = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)
    return f"<pre>{escape(shown)}</pre>"


def json_block(value: Any) -> str:
    """A decoded JSON value shown as JSON (a string in quotes), escaped, in a ``<pre>``."""
    return pre(json.dumps(value, indent=2, ensure_ascii=False))


def status(value: str) -> str:
    return f'<span class="s-{escape(value)}">{escape(value)}</span>'


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def run_href(site: Site, run_id: str) -> str:
    return site.href("/runs/" + quote(run_id, safe=""))


def run_link(site: Site, run_id: str | None) -> str:
    if run_id is None:
        return "-"
    return f'<a href="{escape(run_href(site, run_id))}">{escape(run_id)}</a>'


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    empty: str,
    *,
    table_id: str | None = None,
) -> str:
    """A table of already-escaped cells, or a line saying there is nothing."""
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    if not body:
        return f'<p class="muted">{escape(empty)}</p>'
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    ident = f' id="{escape(table_id)}"' if table_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def button(label: str, action: str, *, confirm: str, key: str | None = None, **data: str) -> str:
    """A button the script turns into a confirmed POST to the JSON API ``action``."""
    attrs = "".join(f' data-{escape(k)}="{escape(v)}"' for k, v in data.items())
    keyed = f' data-key="{escape(key)}" title="key {escape(key)}"' if key else ""
    return (
        f'<button type="button" class="act" data-action="{escape(action)}" '
        f'data-confirm="{escape(confirm)}"{keyed}{attrs}>{escape(label)}</button>'
    )


def shell(site: Site, title: str, path: str, live: str, *, tools: str = "") -> str:
    """A whole HTML document: navigation, ``tools`` (forms that act, outside the live
    region) and the live region with its first contents."""
    links = "".join(
        f'<a href="{escape(site.href(href))}"{" class=here" if href == path else ""}'
        f' title="key g {key}">{escape(label)}</a>'
        for href, label, key in NAV
    )
    script = site.href("/static/app.js")
    return (
        '<!doctype html>\n<html><head><meta charset="utf-8">'
        f"<title>{escape(title)} - pyrula</title><style>{STYLE}</style>"
        f'<script src="{escape(script)}" defer></script></head>'
        f'<body data-prefix="{escape(site.prefix)}" data-live="{"1" if site.live else ""}">'
        f"<header><b>pyrula</b> &nbsp; {links}"
        f'<span class="muted">store {escape(site.store)} &middot; press <kbd>?</kbd> for keys'
        f'</span></header><main><h1>{escape(title)}</h1><div class="msg" id="msg"></div>'
        f'{tools}<div id="live">{live}</div>'
        f'<div id="keys" class="box" hidden>{KEYS_HELP}</div></main></body></html>\n'
    )


KEYS_HELP = (
    "<h3>Keys</h3><kbd>g</kbd> then <kbd>o</kbd> overview, <kbd>u</kbd> runs, <kbd>w</kbd> "
    "workers, <kbd>q</kbd> queues, <kbd>s</kbd> schedules, <kbd>e</kbd> owners, <kbd>d</kbd> "
    "dead letters &middot; <kbd>/</kbd> search &middot; <kbd>j</kbd>/<kbd>k</kbd> move in a "
    "table, <kbd>Enter</kbd> open &middot; <kbd>n</kbd>/<kbd>p</kbd> next/previous page "
    "&middot; on a run: <kbd>r</kbd> retry, <kbd>c</kbd> cancel, <kbd>t</kbd> terminate, "
    "<kbd>x</kbd> signal &middot; on a schedule row: <kbd>P</kbd> pause/resume, <kbd>R</kbd> "
    "run now &middot; <kbd>?</kbd> this help"
)


def error_page(site: Site, code: int, message: str) -> str:
    body = f'<p class="err">{escape(message)}</p><p><a href="{escape(site.href("/"))}">runs</a></p>'
    return shell(replace(site, live=False), f"{code}", "", body)
