"""The keywords broker/schema_validation.py checks with its own functions instead of jsonschema's,
because jsonschema's can hurt the process on a hostile payload or schema:

- `pattern`, `patternProperties`, and `additionalProperties` (which `patternProperties` decides):
  jsonschema runs Python's `re`, which backtracks (`^(a+)+$` on `"a" * 34 + "!"` runs for
  minutes); here RE2, in linear time, charged by the characters it reads.
- `uniqueItems`: jsonschema compares every pair of items that cannot be sorted (4,000 objects:
  15 s); here each item's canonical JSON text goes into a set.
- `enum`, `const`: jsonschema compares deeply, once per allowed value; here canonical JSON text,
  each value put in that form once.
- `multipleOf`: jsonschema raises OverflowError on a huge integer and a fractional divisor (a
  500); here exact arithmetic takes over where floats overflow.
- `unevaluatedProperties`, `unevaluatedItems`: jsonschema follows references with no limit (a
  reference back to the top recurses until the stack ends) and matches with `re`; here the walk
  is counted, bounded in depth, and matches with RE2.

Each function takes what jsonschema passes a keyword (validator, the keyword's value, the payload
value, the schema) and yields ValidationErrors; broker/schema_budget.py's `current()` is the check
they charge.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable, Iterable, Iterator
from fractions import Fraction
from typing import Any

from jsonschema.exceptions import ValidationError
from referencing.jsonschema import lookup_recursive_ref

from broker.schema_budget import CHARACTERS_PER_STEP, current
from broker.schema_checks import compiled_pattern, specification_of

Errors = Iterator[ValidationError]


def matches(pattern: str, text: str) -> bool:
    """Whether `pattern` matches somewhere in `text` (JSON Schema's patterns are not anchored)."""
    current().budget.spend(1 + len(text) // CHARACTERS_PER_STEP)
    return compiled_pattern(pattern).search(text.encode("utf-8", "surrogatepass")) is not None


def pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Errors:
    if validator.is_type(instance, "string") and not matches(pattern, instance):
        yield ValidationError(f"{_short(instance)} does not match {pattern!r}")


def pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Errors:
    if not validator.is_type(instance, "object"):
        return
    for expression, subschema in patterns.items():
        for key, value in instance.items():
            if matches(expression, key):
                yield from validator.descend(value, subschema, path=key, schema_path=expression)


def additional_properties(validator: Any, additional: Any, instance: Any, schema: Any) -> Errors:
    if not validator.is_type(instance, "object"):
        return
    extras = _additional_keys(instance, schema)
    if validator.is_type(additional, "object"):
        for key in extras:
            yield from validator.descend(instance[key], additional, path=key)
    elif additional is False and extras:
        yield ValidationError(f"Additional properties are not allowed ({_unexpected(extras)})")


def _additional_keys(instance: dict[str, Any], schema: Any) -> list[str]:
    """The members neither `properties` nor a `patternProperties` pattern names."""
    named = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    return [
        key
        for key in instance
        if key not in named and not any(matches(expression, key) for expression in patterns)
    ]


def unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Errors:
    if not unique or not validator.is_type(instance, "array"):
        return
    run = current()
    seen: set[str] = set()
    for index, item in enumerate(instance):
        text = run.canonical(item)
        if text in seen:
            yield ValidationError(
                f"{_short(instance)} has non-unique elements (item {index} repeats an earlier one)"
            )
            return
        seen.add(text)


def enum(validator: Any, allowed: Any, instance: Any, schema: Any) -> Errors:
    run = current()
    if run.canonical(instance) not in run.allowed(allowed):
        yield ValidationError(f"{_short(instance)} is not one of {_short(allowed)}")


def const(validator: Any, expected: Any, instance: Any, schema: Any) -> Errors:
    run = current()
    if run.canonical(instance) != run.canonical(expected, constant=True):
        yield ValidationError(f"{_short(expected)} was expected")


def multiple_of(validator: Any, divisor: Any, instance: Any, schema: Any) -> Errors:
    if not validator.is_type(instance, "number"):
        return
    if isinstance(divisor, int) and isinstance(instance, int):
        failed = instance % divisor != 0
    elif isinstance(instance, float) and not math.isfinite(instance):
        failed = True
    else:
        try:
            quotient = instance / divisor
            failed = quotient != int(quotient)  # as floats, so that 4.0 is a multiple of 0.1
        except OverflowError:  # an integer beyond floats: exact arithmetic
            failed = (Fraction(instance) / Fraction(divisor)).denominator != 1
    if failed:
        yield ValidationError(f"{_short(instance)} is not a multiple of {divisor}")


def unevaluated_properties(validator: Any, leftover: Any, instance: Any, schema: Any) -> Errors:
    if not validator.is_type(instance, "object"):
        return
    evaluated = _evaluated(validator, instance, schema, _property_keys, top=True)
    unevaluated = [key for key in instance if key not in evaluated]
    if leftover is False and unevaluated:
        yield ValidationError(
            f"Unevaluated properties are not allowed ({_unexpected(unevaluated)})"
        )
        return
    for key in unevaluated:
        yield from validator.descend(instance[key], leftover, path=key)


def unevaluated_items(validator: Any, leftover: Any, instance: Any, schema: Any) -> Errors:
    if not validator.is_type(instance, "array"):
        return
    evaluated = _evaluated(validator, instance, schema, _item_indexes, top=True)
    unevaluated = [index for index in range(len(instance)) if index not in evaluated]
    if leftover is False and unevaluated:
        yield ValidationError(f"Unevaluated items are not allowed (from item {unevaluated[0]})")
        return
    for index in unevaluated:
        yield from validator.descend(instance[index], leftover, path=index)


def _evaluated(validator: Any, instance: Any, schema: Any, own: Any, top: bool = False) -> set[Any]:
    """The members (keys of an object, indexes of an array) that `schema` evaluates in
    `instance`: those its own keywords apply to (`own`), and those of the subschemas applied in
    place (references, allOf/anyOf/oneOf, if/then/else, dependentSchemas) that hold. Charged a
    step per member of the instance (each call goes through them), and a level deeper each (a
    reference may lead back here)."""
    if not isinstance(schema, dict):
        return set()
    run = current()
    run.budget.spend(1 + len(instance))
    run.enter()
    try:
        found: set[Any] = own(validator, instance, schema, top)
        for nested, subschema in _in_place(validator, instance, schema):
            found |= _evaluated(nested, instance, subschema, own)
        return found
    finally:
        run.leave()


def _in_place(validator: Any, instance: Any, schema: dict[str, Any]) -> Iterable[tuple[Any, Any]]:
    """The subschemas applied to the instance itself, with the validator for each (a reference's
    target resolved where jsonschema resolves it), leaving out branches that do not hold."""
    for keyword in ("$ref", "$dynamicRef"):
        if isinstance(schema.get(keyword), str) and keyword in validator.VALIDATORS:
            resolved = validator._resolver.lookup(schema[keyword])
            target = validator.evolve(schema=resolved.contents, _resolver=resolved.resolver)
            yield target, resolved.contents
    if "$recursiveRef" in schema and "$recursiveRef" in validator.VALIDATORS:
        resolved = lookup_recursive_ref(validator._resolver)
        target = validator.evolve(schema=resolved.contents, _resolver=resolved.resolver)
        yield target, resolved.contents
    for keyword in ("allOf", "anyOf", "oneOf"):
        for subschema in schema.get(keyword, ()):
            if _holds(validator, instance, subschema):
                yield _scoped(validator, subschema), subschema
    if "if" in schema:
        if _holds(validator, instance, schema["if"]):
            yield _scoped(validator, schema["if"]), schema["if"]
            if "then" in schema:
                yield _scoped(validator, schema["then"]), schema["then"]
        elif "else" in schema:
            yield _scoped(validator, schema["else"]), schema["else"]
    if validator.is_type(instance, "object"):
        for key, subschema in schema.get("dependentSchemas", {}).items():
            if key in instance:
                yield _scoped(validator, subschema), subschema


def _scoped(validator: Any, subschema: Any) -> Any:
    """The validator of a subschema, its references resolved from the subschema's `$id` if it
    has one (as jsonschema's own descent does)."""
    resource = specification_of(type(validator)).create_resource(subschema)
    return validator.evolve(
        schema=subschema, _resolver=validator._resolver.in_subresource(resource)
    )


def _holds(validator: Any, instance: Any, subschema: Any) -> bool:
    return next(validator.descend(instance, subschema), None) is None


def _property_keys(validator: Any, instance: Any, schema: dict[str, Any], top: bool) -> set[Any]:
    if not validator.is_type(instance, "object"):
        return set()
    keys = set(schema.get("properties", {})) & set(instance)
    patterns = schema.get("patternProperties", {})
    keys.update(key for key in instance if any(matches(p, key) for p in patterns))
    if "additionalProperties" in schema:
        keys.update(
            key
            for key in _additional_keys(instance, schema)
            if _holds(validator, instance[key], schema["additionalProperties"])
        )
    if not top and "unevaluatedProperties" in schema:
        keys.update(
            key
            for key in instance
            if _holds(validator, instance[key], schema["unevaluatedProperties"])
        )
    return keys


def _item_indexes(validator: Any, instance: Any, schema: dict[str, Any], top: bool) -> set[Any]:
    if not validator.is_type(instance, "array"):
        return set()
    everything = set(range(len(instance)))
    items = schema.get("items")
    if "items" in schema and not isinstance(items, list):
        return everything  # one schema for every item (after prefixItems)
    if isinstance(items, list) and "additionalItems" in schema:
        return everything  # Draft 2019-09: the array form, and a schema for the rest
    counted = len(items) if isinstance(items, list) else len(schema.get("prefixItems", ()))
    indexes = set(range(min(counted, len(instance))))
    if "contains" in schema:
        indexes.update(i for i in everything if _holds(validator, instance[i], schema["contains"]))
    if not top and "unevaluatedItems" in schema:
        indexes.update(
            i for i in everything if _holds(validator, instance[i], schema["unevaluatedItems"])
        )
    return indexes


_REPR = reprlib.Repr()  # a bounded repr: the refusal keeps 300 characters of a message
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 120, 120
_REPR.maxlist = _REPR.maxdict = _REPR.maxtuple = _REPR.maxset = 8


def _unexpected(keys: list[str]) -> str:
    """The members no keyword allowed, in jsonschema's words (the first 20, in order)."""
    named = ", ".join(repr(key) for key in sorted(keys)[:20])
    return f"{named} {'was' if len(keys) == 1 else 'were'} unexpected"


def _short(value: Any) -> str:
    return _REPR.repr(value)


OWN_KEYWORDS: dict[str, Callable[..., Errors]] = {
    "pattern": pattern,
    "patternProperties": pattern_properties,
    "additionalProperties": additional_properties,
    "uniqueItems": unique_items,
    "enum": enum,
    "const": const,
    "multipleOf": multiple_of,
    "unevaluatedProperties": unevaluated_properties,
    "unevaluatedItems": unevaluated_items,
}
