"""Just enough of Prometheus' text format to read the broker's /metrics: samples and labels."""

from __future__ import annotations

import re
from dataclasses import dataclass

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(?P<key>[A-Za-z_][A-Za-z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def samples(text: str, name: str) -> list[Sample]:
    """The samples of metric `name` (a counter's `_total` included in the name given)."""
    found = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match["name"] != name:
            continue
        labels = {
            label["key"]: re.sub(
                r"\\[\\\"n]", lambda escape: _UNESCAPE[str(escape[0])], label["value"]
            )
            for label in _LABEL.finditer(match["labels"] or "")
        }
        found.append(Sample(name, labels, float(match["value"])))
    return found
