"""Figures of the fault-injection tests, printed at the end of the run (tests/conftest.py), so
every CI log says how many deliveries repeated and how each fault ended (docs/reliability.md)."""

from __future__ import annotations

FIGURES: list[str] = []


def report(test: str, **figures: object) -> None:
    FIGURES.append(f"{test}: " + ", ".join(f"{name}={value}" for name, value in figures.items()))
