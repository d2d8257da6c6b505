"""Line charts of the reports page (server-rendered SVG, like ui/charts.py's bars): one line per
series over the report's periods, a gap where a period has no value."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass

from django.utils.safestring import SafeString, mark_safe

from ui.charts import compact_number, nice_scale

WIDTH, HEIGHT = 640, 240
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 44, 30
TEXT, GRID = "#374151", "#e5e7eb"


@dataclass(frozen=True)
class Line:
    name: str
    values: Sequence[float | None]  # one per label; None: no figure for that period
    colour: str


def line_chart(
    title: str,
    labels: Sequence[str],
    lines: Sequence[Line],
    *,
    unit: str = "",
    top: float | None = None,
    label_every: int = 1,
) -> SafeString:
    """A chart of `lines` over `labels`; the y axis goes to `top`, or a round number above the
    largest value."""
    svg = ET.Element(
        "svg",
        {
            "xmlns": "http://www.w3.org/2000/svg",
            "viewBox": f"0 0 {WIDTH} {HEIGHT}",
            "role": "img",
            "class": "chart",
            "font-family": "system-ui, sans-serif",
            "font-size": "11",
        },
    )
    ET.SubElement(svg, "title").text = title
    _text(svg, LEFT, 16, title, weight="600", size="13")
    largest = max((v for line in lines for v in line.values if v is not None), default=0.0)
    step = (top or 1.0) / 4
    if top is None:
        top, step = nice_scale(largest)
    plot_width, plot_height = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_width / max(len(labels), 1)

    def x(index: int) -> float:
        return LEFT + (index + 0.5) * slot

    def y(value: float) -> float:
        return TOP + plot_height * (1 - value / top)

    for tick in range(round(top / step) + 1):
        level = y(tick * step)
        _line(svg, LEFT, level, WIDTH - RIGHT, level, GRID if tick else TEXT)
        _text(svg, LEFT - 6, level + 4, compact_number(tick * step) + unit, "end")
    for index, label in enumerate(labels):
        if index % label_every == 0:
            _text(svg, x(index), HEIGHT - BOTTOM + 17, label, "middle")
    legend_x = WIDTH - RIGHT
    for line in reversed(lines):
        legend_x -= 7 * len(line.name) + 22
        ET.SubElement(
            svg, "rect", x=_fmt(legend_x), y="22", width="10", height="10", fill=line.colour
        )
        _text(svg, legend_x + 14, 31, line.name)
    for line in lines:
        for run in _runs(line.values):
            points = " ".join(f"{_fmt(x(i))},{_fmt(y(v))}" for i, v in run)
            group = ET.SubElement(svg, "g", {"class": "line"})
            ET.SubElement(group, "title").text = f"{line.name}: " + ", ".join(
                f"{labels[i]} {compact_number(v)}{unit}" for i, v in run[-3:]
            )
            if len(run) == 1:
                ET.SubElement(
                    group, "circle", cx=_fmt(x(run[0][0])), cy=_fmt(y(run[0][1])), r="2.5",
                    fill=line.colour,
                )  # fmt: skip
            else:
                ET.SubElement(
                    group, "polyline", {"stroke-width": "2"}, points=points, fill="none",
                    stroke=line.colour,
                )  # fmt: skip
    if largest == 0 and not any(v is not None for line in lines for v in line.values):
        _text(svg, LEFT + plot_width / 2, TOP + plot_height / 2, "No figures", "middle")
    return mark_safe(ET.tostring(svg, encoding="unicode"))  # noqa: S308 (escaped by ElementTree)


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
    size: str = "11",
) -> None:
    attributes = {"text-anchor": anchor, "font-weight": weight, "font-size": size, "fill": TEXT}
    attributes.update(x=_fmt(x), y=_fmt(y))
    ET.SubElement(svg, "text", attributes).text = content


def _fmt(number: float) -> str:
    return f"{number:.1f}".removesuffix(".0")
