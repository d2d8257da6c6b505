"""Payloads checked against an event type's schema within bounds (docs/api.md, "Event type
catalogue"): jsonschema's validator for the schema's draft, with every keyword counted against
the publish's budget (broker/schema_budget.py) and the keywords that can hurt replaced by
broker/schema_keywords.py's. A schema saved before broker/schema_checks.py existed is checked
again where it is compiled, and refused there rather than half-run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

from jsonschema import validators
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator
from referencing import Registry
from referencing.exceptions import Unresolvable

from broker.schema_budget import CHARACTERS_PER_STEP, Budget, Run, check_depth, current, running
from broker.schema_checks import SchemaRefused, checked, never_fetch
from broker.schema_keywords import OWN_KEYWORDS

Keyword = Callable[..., Any]

# Entering a subschema builds a validator for it (jsonschema's `descend`): several times the work
# of applying a plain keyword, so each one a keyword may do is charged DESCENT_STEPS.
DESCENT_STEPS = 4
# Keywords that enter a subschema for each item or member of the payload value.
THROUGH_ENTRIES = frozenset(
    {
        "items",
        "prefixItems",
        "additionalItems",
        "contains",
        "unevaluatedItems",
        "properties",
        "patternProperties",
        "additionalProperties",
        "unevaluatedProperties",
        "propertyNames",
        "dependentSchemas",
        "dependencies",
    }
)
# Keywords that enter each of the subschemas in their value (an array), on the same payload value.
THROUGH_BRANCHES = frozenset({"allOf", "anyOf", "oneOf"})
# Keywords that enter one subschema (`if`: two, with its `then` or `else`); a reference is charged
# four descents: its lookup (a URI joined, a registry read, a JSON pointer followed) takes three.
INTO_ONE = {"$ref": 4, "$dynamicRef": 4, "$recursiveRef": 4, "not": 1, "if": 2}
REFERENCES = frozenset({"$ref", "$dynamicRef", "$recursiveRef"})


class BoundedSchema:
    """An event type's schema, compiled once, checking payloads within a budget."""

    def __init__(self, schema: dict[str, Any]) -> None:
        """SchemaRefused when the schema breaks a rule of broker/schema_checks.py. Every schema
        the catalogue holds passed its metaschema when saved; the other rules are checked again,
        for those saved before they existed."""
        dialect = checked(schema, metaschema=False)
        # Without its `$schema`: jsonschema would answer a reference to the top with the stock
        # validator of the draft named there, which has none of these bounds.
        top = {key: value for key, value in schema.items() if key != "$schema"}
        registry: Registry[Any] = Registry(retrieve=never_fetch)  # type: ignore[call-arg]
        self._validator = _bounded(dialect)(top, registry=registry)
        self._constants: dict[int, tuple[Any, Any]] = {}

    def first_error(self, document: Any, budget: Budget) -> ValidationError | None:
        """The first place (in document order) where `document` breaks the schema, or None.
        TooCostly when the document or its check goes beyond a limit of broker/schema_budget.py,
        charged to `budget`."""
        check_depth(document)
        with running(Run(budget, self._constants)):
            try:
                errors = sorted(self._validator.iter_errors(document), key=_place)
            except Unresolvable as error:  # a schema from before the checks; never fetched
                raise SchemaRefused(f"{error.ref!r} does not resolve inside the schema.") from None
        return errors[0] if errors else None


@cache
def _bounded(dialect: type[Validator]) -> type[Validator]:
    """The draft's validator with every keyword counted, and ours where jsonschema's can hurt."""
    stock: dict[str, Keyword] = dict(dialect.VALIDATORS)
    keywords = {
        name: _counted(name, OWN_KEYWORDS.get(name, apply)) for name, apply in stock.items()
    }
    bounded: type[Validator] = validators.extend(dialect, keywords)  # type: ignore[no-untyped-call]
    return bounded


def _counted(name: str, apply: Keyword) -> Keyword:
    """`apply`, charged to the check under way before it runs: a step, one per entry of its
    value (and of the arrays in it), DESCENT_STEPS per subschema it may enter and, for a
    reference, one per level the check is at; then each error it yields, by its length."""
    through_entries = name in THROUGH_ENTRIES
    through_branches = name in THROUGH_BRANCHES
    into = INTO_ONE.get(name, 0)
    reference = name in REFERENCES

    def counted(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
        run = current()
        descents = into
        if through_entries and isinstance(instance, dict | list):
            descents += len(instance)
        elif through_branches:
            descents += len(value)
        steps = 1 + _value_size(value) + DESCENT_STEPS * descents
        if reference:
            # Resolving a dynamic anchor goes through every resource the check has entered, at
            # most one per level it is at.
            steps += run.depth
        run.budget.spend(steps)
        run.enter()
        try:
            for error in apply(validator, value, instance, schema) or ():
                run.budget.spend(1 + len(error.message) // CHARACTERS_PER_STEP)
                yield error
        finally:
            # Also when jsonschema stops at the first error (is_valid) and drops the generator.
            run.leave()

    return counted


def _value_size(value: Any) -> int:
    """The entries of a keyword's value, and those of the arrays in an object value (the names
    each member of `dependentRequired` requires): what the keyword goes through."""
    if isinstance(value, list):
        return len(value)
    if isinstance(value, dict):
        return len(value) + sum(
            len(member) for member in value.values() if isinstance(member, list)
        )
    return 0


def _place(error: ValidationError) -> list[str]:
    return [str(part) for part in error.absolute_path]
