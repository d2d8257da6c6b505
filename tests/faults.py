"""Figures of the fault-injection tests, printed at the end of the run (tests/conftest.py), so
every CI log says how many deliveries repeated and how each fault ended (docs/reliability.md)."""

from __future__ import annotations

from collections import Counter

FIGURES: list[str] = []


def report(test: str, **figures: object) -> None:
    FIGURES.append(f"{test}: " + ", ".join(f"{name}={value}" for name, value in figures.items()))


def report_counts(test: str, counts: Counter[str]) -> None:
    """How often each outcome came up, e.g. over the cases of a property-based test; reported
    again, the figures replace the earlier ones (a module's fixtures may be set up twice)."""
    FIGURES[:] = [line for line in FIGURES if not line.startswith(f"{test} (")]
    if counts:
        figures = {key.replace(" ", "_"): counts[key] for key in sorted(counts)}
        report(f"{test} ({sum(counts.values())} cases)", **figures)
