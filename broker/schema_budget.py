"""How much work checking payloads against event type schemas may do (docs/api.md, "Event type
catalogue"), counted in steps rather than seconds, so that a payload and a schema get the same
answer on every machine and under any load.

One publish (a message, or a whole batch) has MAX_VALIDATION_STEPS. broker/schema_validation.py
charges every keyword it applies: one step, one per entry of the keyword's value (`required`
with 50 names: 51), and more for each subschema it may enter (broker/schema_validation.py says
how much); a yielded error one step per CHARACTERS_PER_STEP characters of its message (messages
repeat the value they are about). broker/schema_keywords.py charges what its keywords do beyond
that: the characters a pattern is run over, the values it puts in canonical form. Each check
also stops MAX_VALIDATION_DEPTH keywords deep: a schema whose references lead back to itself
without going into the payload would otherwise never end.

A step is one or two microseconds of one core here: the budget is at most about 0.6 s of work,
whatever the payload, the schema and the attack (docs/reliability.md, "Hostile receivers and
producers"), and a batch of 1,000 typical events takes about half of it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, cast

MAX_VALIDATION_STEPS = 400_000
MAX_VALIDATION_DEPTH = 128
MAX_PAYLOAD_DEPTH = 32
CHARACTERS_PER_STEP = 100


class TooCostly(ValueError):
    """Checking a payload would cost more than a limit allows; str() names the limit."""


class Budget:
    """The steps left to one publish: a message, or every message of a batch together."""

    def __init__(self, steps: int = MAX_VALIDATION_STEPS) -> None:
        self.steps = steps
        self.left = steps

    def spend(self, steps: int) -> None:
        self.left -= steps
        if self.left < 0:
            raise TooCostly(
                f"that takes more than {self.steps} steps, the most"
                " one publish (a message, or a whole batch) may take"
            )


class Run:
    """One payload's check: the publish's budget, how deep the check is now, and the canonical
    form of the values compared (`canonical`)."""

    def __init__(self, budget: Budget, constants: dict[int, tuple[Any, Any]]) -> None:
        self.budget = budget
        self.depth = 0
        self._constants = constants  # the schema's `enum` and `const` values, kept with it
        self._values: dict[int, tuple[Any, Any]] = {}  # the payload's, for this check only

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_VALIDATION_DEPTH:
            raise TooCostly(
                f"that goes more than {MAX_VALIDATION_DEPTH} schemas deep (a reference"
                " that leads back to where it is, without going into the payload, never ends)"
            )

    def leave(self) -> None:
        self.depth -= 1

    def canonical(self, value: Any, constant: bool = False) -> str:
        """`value` as canonical JSON text, so that JSON Schema's equality is string equality:
        1 equals 1.0, true does not equal 1, objects are equal whatever their key order. Each
        value is put in that form once (a constant of the schema once for every check)."""
        if not isinstance(value, dict | list):
            length = len(value) if isinstance(value, str) else 0
            self.budget.spend(1 + length // CHARACTERS_PER_STEP)
            return _text(_plain(value, self.budget))
        known = self._constants if constant else self._values
        found = known.get(id(value))
        if found is None:
            # The value is kept with its text: its id cannot be reused while it is known.
            found = known[id(value)] = (value, _text(_plain(value, self.budget)))
        return cast(str, found[1])

    def allowed(self, values: list[Any]) -> frozenset[str]:
        """The canonical texts of an `enum`'s values, as a set made once per schema."""
        found = self._constants.get(id(values))
        if found is None:
            texts = frozenset(self.canonical(value, constant=True) for value in values)
            found = self._constants[id(values)] = (values, texts)
        return cast(frozenset[str], found[1])


def _plain(value: Any, budget: Budget) -> Any:
    """`value` with every integral float made an int (1.0 and 1 print alike), charged a step per
    member as it goes. Recursive: payloads and schemas are at most 32 levels deep here."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        budget.spend(1 + len(value))
        return [_plain(item, budget) for item in value]
    if isinstance(value, dict):
        budget.spend(1 + len(value))
        return {key: _plain(item, budget) for key, item in value.items()}
    return value


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


_RUN: ContextVar[Run] = ContextVar("schema_run")


def current() -> Run:
    """The check under way in this thread (broker/schema_keywords.py's functions run inside
    jsonschema, which passes them no more than the validator, values and schema)."""
    return _RUN.get()


@contextmanager
def running(run: Run) -> Iterator[Run]:
    token = _RUN.set(run)
    try:
        yield run
    finally:
        _RUN.reset(token)


def check_depth(document: Any) -> None:
    """TooCostly if `document` nests deeper than MAX_PAYLOAD_DEPTH (without recursion)."""
    stack = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > MAX_PAYLOAD_DEPTH:
                raise TooCostly(f"it is nested deeper than {MAX_PAYLOAD_DEPTH} levels")
            members = node.values() if isinstance(node, dict) else node
            stack.extend(
                (member, depth + 1) for member in members if isinstance(member, dict | list)
            )
