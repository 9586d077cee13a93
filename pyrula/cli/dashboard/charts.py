"""Charts the dashboard draws itself, as inline SVG: no script library, nothing fetched."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

WIDTH = 420
HEIGHT = 120
PAD_LEFT = 44
PAD_BOTTOM = 18


def bar_chart(
    title: str,
    values: Sequence[float | None],
    *,
    color: str,
    shown: Callable[[float], str],
    chart_id: str,
) -> str:
    """One bar per value (None: no bar), oldest left, scaled to the largest value; the
    axis says the largest value and the span (``-60 min`` to ``now``)."""
    top = max((v for v in values if v is not None), default=0.0)
    inner_w = WIDTH - PAD_LEFT
    inner_h = HEIGHT - PAD_BOTTOM
    step = inner_w / max(1, len(values))
    bars = []
    for i, value in enumerate(values):
        if value is None or top <= 0:
            continue
        h = max(1.0, inner_h * value / top) if value > 0 else 0.0
        x = PAD_LEFT + i * step
        bars.append(
            f'<rect x="{x:.1f}" y="{inner_h - h:.1f}" width="{max(1.0, step - 1):.1f}" '
            f'height="{h:.1f}" fill="{color}"><title>{escape(shown(value))}</title></rect>'
        )
    span = max(0, len(values) - 1)
    axis = (
        f'<line x1="{PAD_LEFT}" y1="{inner_h}" x2="{WIDTH}" y2="{inner_h}" stroke="#999"/>'
        f'<line x1="{PAD_LEFT}" y1="0" x2="{PAD_LEFT}" y2="{inner_h}" stroke="#999"/>'
        f'<text x="{PAD_LEFT - 4}" y="10" text-anchor="end" font-size="10">'
        f"{escape(shown(top))}</text>"
        f'<text x="{PAD_LEFT - 4}" y="{inner_h}" text-anchor="end" font-size="10">0</text>'
        f'<text x="{PAD_LEFT}" y="{HEIGHT - 4}" font-size="10">-{span} min</text>'
        f'<text x="{WIDTH}" y="{HEIGHT - 4}" text-anchor="end" font-size="10">now</text>'
    )
    return (
        f'<figure><figcaption>{escape(title)}</figcaption><svg id="{escape(chart_id)}" '
        f'xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}">'
        f"{axis}{''.join(bars)}</svg></figure>"
    )
