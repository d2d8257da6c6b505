"""What an event type's schema must be before the catalogue keeps it (docs/api.md, "Event type
catalogue"): a valid schema of a draft the broker checks, and one that checking payloads against
cannot hurt the process that does it.

Checked in this order, the first problem refused with its place in the schema (a JSON path):

- at most MAX_SCHEMA_DEPTH levels of nesting (the metaschema check recurses on them);
- `$schema`, when given, names one of DIALECTS;
- a valid schema of that draft (its metaschema);
- then, in every schema object that validation can reach (the subschemas, and the targets of
  references, which a JSON pointer may lead elsewhere):
  - at most MAX_SCHEMA_MEMBERS members: each one is looked at whenever validation enters the
    object, work the step count of a publish does not see;
  - no `$schema` but at the top: jsonschema switches to its stock validator, which has none of
    the bounds of broker/schema_validation.py, wherever it meets one;
  - every `$ref` and `$dynamicRef` resolves inside the schema itself, to an object or a boolean
    (validation crashes on anything else). Nothing is ever fetched (the registry's retrieval
    refuses), and the drafts' metaschemas are not in the registry either: a reference to one
    would run the stock validator again;
  - no reference leads back to where it is through schemas applied to the same value
    (`{"$ref": "#"}`, `{"anyOf": [{"$ref": "#"}]}`): checking would never end;
  - every `pattern` and `patternProperties` key compiles on RE2, the linear-time engine payloads
    are matched with: Python's `re` backtracks (`^(a+)+$` on 35 characters takes it minutes),
    RE2 refuses what needs backtracking (backreferences, lookaround).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import re2  # google-re2
from jsonschema import exceptions, validators
from jsonschema.protocols import Validator
from referencing import Registry, Resource, Specification
from referencing.exceptions import NoSuchResource, Unresolvable
from referencing.jsonschema import specification_with

MAX_SCHEMA_DEPTH = 32
MAX_SCHEMA_MEMBERS = 100

# The drafts a schema may name in `$schema` (without a trailing "#"); none named: 2020-12. Draft 3
# is left out: its `type` and `disallow` hold subschemas that the reference walk below cannot see.
DIALECTS: dict[str, type[Validator]] = {
    "https://json-schema.org/draft/2020-12/schema": validators.Draft202012Validator,
    "https://json-schema.org/draft/2019-09/schema": validators.Draft201909Validator,
    "http://json-schema.org/draft-07/schema": validators.Draft7Validator,
    "http://json-schema.org/draft-06/schema": validators.Draft6Validator,
    "http://json-schema.org/draft-04/schema": validators.Draft4Validator,
}
DEFAULT_DIALECT = "https://json-schema.org/draft/2020-12/schema"

# The keywords whose value is a reference to resolve when validation meets them.
REFERENCE_KEYWORDS = ("$ref", "$dynamicRef")

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # the refusal says why; RE2 would also print it to stderr


class SchemaRefused(ValueError):
    """A schema the catalogue does not take; str() is the place in it and the problem."""


def checked(schema: dict[str, Any], metaschema: bool = True) -> type[Validator]:
    """The validator class of `schema`'s draft, once every rule above holds; SchemaRefused
    naming the first that does not. `metaschema=False` leaves out the metaschema check, for a
    schema saved with it (the most costly check: about 2 s for 64 KiB of small subschemas)."""
    _check_depth(schema)
    dialect = _dialect(schema)
    if metaschema:
        try:
            dialect.check_schema(schema)
        except exceptions.SchemaError as error:
            raise SchemaRefused(f"{error.json_path}: {error.message}") from None
    _check_walk(schema, dialect)
    return dialect


def specification_of(dialect: Any) -> Specification[Any]:
    """referencing's description of a draft (a validator class of jsonschema): where its
    subschemas, `$id`s and anchors are."""
    return specification_with(dialect.ID_OF(dialect.META_SCHEMA) or DEFAULT_DIALECT)


def never_fetch(uri: str) -> Resource[Any]:
    """The registry's retrieval: a reference that is not inside the schema stays unresolved."""
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]


@lru_cache(maxsize=4096)
def compiled_pattern(pattern: str) -> Any:
    """`pattern` compiled by RE2 over UTF-8 bytes (text is matched as UTF-8, lone surrogates
    included); SchemaRefused if RE2 cannot run it."""
    try:
        return re2.compile(pattern.encode(), _RE2_OPTIONS)
    except UnicodeEncodeError:
        raise SchemaRefused(f"{_short(pattern)} holds a lone surrogate.") from None
    except re2.error as error:
        reason = error.args[0].decode() if isinstance(error.args[0], bytes) else error
        raise SchemaRefused(
            f"{_short(pattern)} is not a pattern RE2, the linear-time engine, can run ({reason});"
            " backreferences and lookaround are not supported."
        ) from None


def _dialect(schema: dict[str, Any]) -> type[Validator]:
    named = schema.get("$schema", DEFAULT_DIALECT)
    dialect = DIALECTS.get(named.rstrip("#")) if isinstance(named, str) else None
    if dialect is None:
        known = ", ".join(DIALECTS)
        raise SchemaRefused(f"$.$schema: {_short(named)} is not a draft checked here: {known}.")
    return dialect


def _check_depth(schema: dict[str, Any]) -> None:
    for path, _node, depth in _containers(schema):
        if depth > MAX_SCHEMA_DEPTH:
            raise SchemaRefused(f"{path}: nested deeper than {MAX_SCHEMA_DEPTH} levels.")


def _containers(document: Any) -> Iterator[tuple[str, Any, int]]:
    """Every object and array of `document` with its JSON path and depth (the top is 1); no
    recursion, so a deep document is reported rather than exhausting the stack."""
    stack = [("$", document, 1)]
    while stack:
        path, node, depth = stack.pop()
        if isinstance(node, dict):
            yield path, node, depth
            stack.extend((_child(path, key), value, depth + 1) for key, value in node.items())
        elif isinstance(node, list):
            yield path, node, depth
            stack.extend((f"{path}[{i}]", value, depth + 1) for i, value in enumerate(node))


_PLAIN_KEY = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*\Z")


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if _PLAIN_KEY.match(key) else f"{path}[{json.dumps(key)}]"


def _check_walk(schema: dict[str, Any], dialect: type[Validator]) -> None:
    """Every schema object validation can reach: its members, references and patterns."""
    paths = {id(node): path for path, node, _ in _containers(schema)}
    specification = specification_of(dialect)
    references = [keyword for keyword in REFERENCE_KEYWORDS if keyword in dialect.VALIDATORS]
    root = specification.create_resource(schema)
    stack = [(root, Registry(retrieve=never_fetch).resolver_with_root(root))]  # type: ignore[call-arg]
    seen: set[int] = set()
    in_place: dict[int, list[tuple[str, Any]]] = {}  # node → where it applies a schema to its own
    while stack:
        resource, resolver = stack.pop()
        node = resource.contents
        if id(node) in seen or not isinstance(node, dict):
            continue
        seen.add(id(node))
        path = paths.get(id(node), "$")
        if len(node) > MAX_SCHEMA_MEMBERS:
            raise SchemaRefused(
                f"{path}: {len(node)} members; a schema object has at most {MAX_SCHEMA_MEMBERS}."
            )
        if "$schema" in node and node is not schema:
            raise SchemaRefused(f"{path}: `$schema` is taken only at the top of the schema.")
        _check_patterns(node, path, dialect)
        applied = in_place[id(node)] = list(_applied_in_place(node, path))
        for keyword in references:
            reference = node.get(keyword)
            if not isinstance(reference, str):
                continue
            try:
                resolved = resolver.lookup(reference)
            except Unresolvable:
                raise SchemaRefused(
                    f"{_child(path, keyword)}: {_short(reference)} does not resolve inside the"
                    " schema (nothing is ever fetched)."
                ) from None
            if not isinstance(resolved.contents, dict | bool):  # validation would crash on it
                raise SchemaRefused(
                    f"{_child(path, keyword)}: {_short(reference)} leads to something that is"
                    " not a schema."
                )
            applied.append((f"{_child(path, keyword)}: {_short(reference)}", resolved.contents))
            target = specification.create_resource(resolved.contents)
            stack.append((target, resolved.resolver))
        stack.extend((sub, resolver.in_subresource(sub)) for sub in resource.subresources())
    _check_loops(in_place, paths)


# The keywords that apply their subschemas to the value they are at (not to its members): a loop
# through only these and references checks the same value again and again, and never ends.
IN_PLACE_ONE = ("not", "if", "then", "else")
IN_PLACE_MANY = ("allOf", "anyOf", "oneOf")
IN_PLACE_BY_NAME = ("dependentSchemas", "dependencies")


def _applied_in_place(node: dict[str, Any], path: str) -> Iterator[tuple[str, Any]]:
    for keyword in IN_PLACE_ONE:
        if keyword in node:
            yield _child(path, keyword), node[keyword]
    for keyword in IN_PLACE_MANY:
        if isinstance(node.get(keyword), list):
            yield from ((f"{_child(path, keyword)}[{i}]", s) for i, s in enumerate(node[keyword]))
    for keyword in IN_PLACE_BY_NAME:
        if isinstance(node.get(keyword), dict):
            where = _child(path, keyword)
            yield from ((_child(where, name), s) for name, s in node[keyword].items())


def _check_loops(in_place: dict[int, list[tuple[str, Any]]], paths: dict[int, str]) -> None:
    """SchemaRefused naming a place that leads back to itself through schemas applied in place
    (`{"$ref": "#"}`, `{"anyOf": [{"$ref": "#"}]}`): checking any payload there never ends."""
    done: set[int] = set()
    for start in in_place:
        if start in done:
            continue
        on_path = {start}
        stack = [(start, iter(in_place[start]))]
        while stack:
            node, edges = stack[-1]
            step = next(edges, None)
            if step is None:
                stack.pop()
                on_path.discard(node)
                done.add(node)
                continue
            where, target = step
            if id(target) in on_path:
                raise SchemaRefused(
                    f"{where} leads back to {paths.get(id(target), '$')} without going into the"
                    " payload: checking a payload against it would never end."
                )
            if isinstance(target, dict) and id(target) not in done:
                on_path.add(id(target))
                stack.append((id(target), iter(in_place.get(id(target), []))))


def _check_patterns(node: dict[str, Any], path: str, dialect: type[Validator]) -> None:
    patterns: list[tuple[str, Any]] = []
    if "pattern" in dialect.VALIDATORS:
        patterns.append((_child(path, "pattern"), node.get("pattern")))
    if "patternProperties" in dialect.VALIDATORS and isinstance(
        node.get("patternProperties"), dict
    ):
        where = _child(path, "patternProperties")
        patterns.extend((where, key) for key in node["patternProperties"])
    for where, pattern in patterns:
        if isinstance(pattern, str):
            try:
                compiled_pattern(pattern)
            except SchemaRefused as error:
                raise SchemaRefused(f"{where}: {error}") from None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else f"{text[:117]}..."
