"""Server-rendered SVG charts for the operator UI: no JavaScript, no chart library, no CDN.

Stacked bars (the dashboard's deliveries) and lines (the reports' rates and latencies) share one
canvas, axes and legend. The SVG is built as an XML tree (ElementTree escapes every label), then
inlined in the page. Each bar and line carries a <title>, which browsers show as a tooltip.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass

from django.utils.safestring import SafeString, mark_safe

SVG_NS = "http://www.w3.org/2000/svg"
WIDTH, HEIGHT = 640, 240
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 44, 30  # margins around the plot: axis labels, title, legend
TEXT = "#374151"
GRID = "#e5e7eb"
FONT_SIZE = 11  # of the axes' labels, in the canvas's units
# How wide a label's characters are at most, for laying x labels out without measuring them
# (the server has no fonts): DejaVu Sans's digits, the widest of the usual sans-serif fonts,
# are 0.636 em; most systems' are narrower (Arial's 0.556 em). The labels are dates and times.
CHAR_WIDTH = 0.65 * FONT_SIZE
LABEL_GAP = FONT_SIZE  # the least room between two x labels, so they read as two


@dataclass(frozen=True)
class Series:
    name: str
    values: Sequence[float]  # one per bar
    colour: str


@dataclass(frozen=True)
class Line:
    name: str
    values: Sequence[float | None]  # one per label; None: no figure for that period
    colour: str


def stacked_bars(
    title: str,
    labels: Sequence[str],
    series: Sequence[Series],
    *,
    label_every: int = 1,
    first_label: int = 0,
) -> SafeString:
    """A bar per label, the series stacked bottom-up; x labels on every `label_every`-th bar
    from the bar numbered `first_label` (so that they can fall on round times), or on a
    multiple of `label_every` when labels that close would overlap (`spaced_every`)."""
    if any(len(s.values) != len(labels) for s in series):
        raise ValueError("every series needs one value per label")
    svg = _canvas(title)
    _legend(svg, series)
    totals = [sum(s.values[i] for s in series) for i in range(len(labels))]
    top, step = nice_scale(max(totals, default=0))
    _y_axis(svg, top, step)
    _bars(svg, labels, series, top)
    _x_axis(svg, labels, label_every, first_label)
    if not any(totals):
        _text(svg, LEFT + _plot_width() / 2, TOP + _plot_height() / 2, "Nothing yet", "middle")
    return mark_safe(ET.tostring(svg, encoding="unicode"))  # noqa: S308 (escaped by ElementTree)


def line_chart(
    title: str,
    labels: Sequence[str],
    lines: Sequence[Line],
    *,
    unit: str = "",
    top: float | None = None,
    label_every: int = 1,
    first_label: int = 0,
) -> SafeString:
    """A chart of `lines` over `labels`, with a gap where a value is missing; the y axis goes to
    `top` (a rate's 1.0, say), or to a round number above the largest value. X labels as
    `stacked_bars` places them."""
    svg = _canvas(title)
    _legend(svg, lines)
    largest = max((v for line in lines for v in line.values if v is not None), default=0.0)
    top, step = (top, top / 4) if top else nice_scale(largest)
    _y_axis(svg, top, step, unit)
    _x_axis(svg, labels, label_every, first_label)
    for line in lines:
        for run in _runs(line.values):
            _polyline(svg, line, run, labels, top, unit)
    if not any(v is not None for line in lines for v in line.values):
        _text(svg, LEFT + _plot_width() / 2, TOP + _plot_height() / 2, "No figures", "middle")
    return mark_safe(ET.tostring(svg, encoding="unicode"))  # noqa: S308 (escaped by ElementTree)


def nice_scale(largest: float, ticks: int = 4) -> tuple[float, float]:
    """An axis top and a tick step of 1, 2 or 5 times a power of ten that covers `largest`."""
    if largest <= 0:
        return 1.0, 0.25
    rough = largest / ticks
    power = 10 ** math.floor(math.log10(rough))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= rough)
    return math.ceil(largest / step) * step, step


def label_width(label: str) -> float:
    """The most room an x label takes on the canvas (CHAR_WIDTH a character)."""
    return len(label) * CHAR_WIDTH


def fewest_between_labels(labels: Sequence[str]) -> int:
    """The smallest N such that x labels on every N-th slot cannot overlap: the slots between
    two labels are at least as wide as the widest label and LABEL_GAP."""
    if not labels:
        return 1
    slot = _plot_width() / len(labels)
    widest = max(label_width(label) for label in labels)
    return max(1, math.ceil((widest + LABEL_GAP) / slot))


def spaced_every(every: int, labels: Sequence[str]) -> int:
    """`every`, or its smallest multiple that keeps x labels apart (so labels a caller put on
    round times stay on round times, fewer of them)."""
    needed = fewest_between_labels(labels)
    return every if every >= needed else every * math.ceil(needed / every)


def compact_number(value: float) -> str:
    """1200 -> "1.2k", 3000000 -> "3M", 0.5 -> "0.5"."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.3g}"


def _canvas(title: str) -> ET.Element:
    svg = ET.Element(
        "svg",
        {
            "xmlns": SVG_NS,
            "viewBox": f"0 0 {WIDTH} {HEIGHT}",
            "role": "img",
            "class": "chart",
            "font-family": "system-ui, sans-serif",
            "font-size": str(FONT_SIZE),
        },
    )
    ET.SubElement(svg, "title").text = title
    _text(svg, LEFT, 16, title, weight="600", size="13")
    return svg


def _plot_width() -> float:
    return WIDTH - LEFT - RIGHT


def _plot_height() -> float:
    return HEIGHT - TOP - BOTTOM


def _y(value: float, top: float) -> float:
    return TOP + _plot_height() * (1 - value / top)


def _x(index: int, count: int) -> float:
    """The middle of the slot of the index-th label."""
    return LEFT + (index + 0.5) * _plot_width() / max(count, 1)


def _y_axis(svg: ET.Element, top: float, step: float, unit: str = "") -> None:
    for i in range(round(top / step) + 1):
        value = i * step
        y = _y(value, top)
        _line(svg, LEFT, y, WIDTH - RIGHT, y, GRID if i else TEXT)
        _text(svg, LEFT - 6, y + 4, compact_number(value) + unit, "end")
    _line(svg, LEFT, TOP, LEFT, TOP + _plot_height(), TEXT)


def _bars(svg: ET.Element, labels: Sequence[str], series: Sequence[Series], top: float) -> None:
    slot = _plot_width() / max(len(labels), 1)
    for i, label in enumerate(labels):
        bar = ET.SubElement(svg, "g", {"class": "bar"})
        parts = ", ".join(f"{s.name} {s.values[i]:,g}" for s in series)
        ET.SubElement(bar, "title").text = f"{label}: {parts}"
        base = 0.0
        for s in series:
            if s.values[i] > 0:
                y = _y(base + s.values[i], top)
                ET.SubElement(
                    bar,
                    "rect",
                    x=_fmt(LEFT + i * slot + slot * 0.1),
                    y=_fmt(y),
                    width=_fmt(slot * 0.8),
                    height=_fmt(_y(base, top) - y),
                    fill=s.colour,
                )
            base += s.values[i]


def _polyline(
    svg: ET.Element,
    line: Line,
    run: list[tuple[int, float]],
    labels: Sequence[str],
    top: float,
    unit: str,
) -> None:
    group = ET.SubElement(svg, "g", {"class": "line"})
    latest = ", ".join(f"{labels[i]} {compact_number(v)}{unit}" for i, v in run[-3:])
    ET.SubElement(group, "title").text = f"{line.name}: {latest}"
    points = [(_fmt(_x(i, len(labels))), _fmt(_y(min(v, top), top))) for i, v in run]
    if len(points) == 1:
        ((cx, cy),) = points
        ET.SubElement(group, "circle", cx=cx, cy=cy, r="2.5", fill=line.colour)
    else:
        ET.SubElement(
            group,
            "polyline",
            {"stroke-width": "2", "fill": "none", "stroke": line.colour},
            points=" ".join(f"{x},{y}" for x, y in points),
        )


def _runs(values: Sequence[float | None]) -> list[list[tuple[int, float]]]:
    """Consecutive stretches of values that exist: a line is not drawn across a gap."""
    runs: list[list[tuple[int, float]]] = [[]]
    for index, value in enumerate(values):
        if value is None:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append((index, value))
    return [run for run in runs if run]


def _x_axis(svg: ET.Element, labels: Sequence[str], every: int, first: int) -> None:
    """A tick and a label on every `every`-th slot from `first`, thinned so that no two labels
    overlap (`spaced_every`); a label that would stick out of the canvas is left out."""
    axis = ET.SubElement(svg, "g", {"class": "x-axis"})
    every = spaced_every(max(every, 1), labels)
    for i, label in enumerate(labels):
        x = _x(i, len(labels))
        half = label_width(label) / 2
        if (i - first) % every == 0 and half <= x <= WIDTH - half:
            _line(axis, x, TOP + _plot_height(), x, TOP + _plot_height() + 4, TEXT)
            _text(axis, x, HEIGHT - BOTTOM + 17, label, "middle")


def _legend(svg: ET.Element, series: Sequence[Series | Line]) -> None:
    x = WIDTH - RIGHT
    for s in reversed(series):  # right-aligned: lay out from the right edge
        x -= 7 * len(s.name) + 22
        ET.SubElement(svg, "rect", x=_fmt(x), y="22", width="10", height="10", fill=s.colour)
        _text(svg, x + 14, 31, s.name)


def _line(svg: ET.Element, x1: float, y1: float, x2: float, y2: float, colour: str) -> None:
    ET.SubElement(svg, "line", x1=_fmt(x1), y1=_fmt(y1), x2=_fmt(x2), y2=_fmt(y2), stroke=colour)


def _text(
    svg: ET.Element,
    x: float,
    y: float,
    content: str,
    anchor: str = "start",
    *,
    weight: str = "normal",
    size: str = str(FONT_SIZE),
) -> None:
    attributes = {"text-anchor": anchor, "font-weight": weight, "font-size": size, "fill": TEXT}
    attributes.update(x=_fmt(x), y=_fmt(y))
    ET.SubElement(svg, "text", attributes).text = content


def _fmt(number: float) -> str:
    return f"{number:.1f}".removesuffix(".0")
