"""docs/openapi.json is the schema the code generates (broker/api/schema_file.py), and that schema
is complete enough to generate clients from (docs/api.md, "OpenAPI schema")."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from typing import Any

import pytest

from broker.api.schema_file import REGENERATE_COMMAND, SCHEMA_FILE, GeneratedSchema, generate_schema

HTTP_METHODS = {"get", "put", "post", "delete", "patch", "head", "options"}
OPERATION_ID = re.compile(r"[a-z]+(_[a-z]+)*\Z")  # snake_case, verb first (broker/api/schema.py)
# The one error body; the batch broadcast's detailed refusals; the health report of a 503 /_status.
ERROR_SCHEMAS = {"Error", "BatchError", "BatchDuplicates", "Status"}


@pytest.fixture(scope="module")
def generated() -> GeneratedSchema:
    return generate_schema()


def operations(schema: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for path, entries in schema["paths"].items():
        for method, operation in entries.items():
            if method in HTTP_METHODS:
                yield f"{method.upper()} {path}", operation


def test_generation_gives_no_warnings(generated):
    assert generated.problems == []


def test_the_committed_file_is_the_generated_schema(generated):
    committed = SCHEMA_FILE.read_text() if SCHEMA_FILE.exists() else ""
    if committed != generated.text:
        # A short diff, not pytest's comparison of two 200 kB strings.
        diff = difflib.unified_diff(
            committed.splitlines(),
            generated.text.splitlines(),
            "committed",
            "generated",
            lineterm="",
        )
        shown = "\n".join(line for _, line in zip(range(60), diff, strict=False))
        pytest.fail(
            f"docs/openapi.json differs from the schema the code generates; run "
            f"`{REGENERATE_COMMAND}` and commit the file.\n{shown}"
        )


def test_the_file_does_not_follow_the_environments_settings(generated, settings):
    settings.BROKER_PUBLIC_STATUS = False
    settings.BROKER_PUBLIC_METRICS = True

    assert generate_schema().text == generated.text


def test_it_names_no_server_and_no_date(generated):
    assert "servers" not in generated.schema
    assert not re.search(r"\b20\d\d-\d\d-\d\d", generated.text)


def test_every_operation_has_a_stable_readable_unique_operation_id(generated):
    ids = [operation["operationId"] for _, operation in operations(generated.schema)]

    assert [name for name in ids if not OPERATION_ID.match(name)] == []
    assert len(ids) == len(set(ids))


def test_every_operation_declares_its_success_and_its_errors(generated):
    for name, operation in operations(generated.schema):
        responses = operation["responses"]
        successes = {code: answer for code, answer in responses.items() if code.startswith("2")}
        assert successes, name
        for code, answer in successes.items():
            # A body is typed; no body is an explicit, described answer (204, a 201 with Location).
            for media in answer.get("content", {}).values():
                assert media.get("schema"), (name, code)
            assert answer.get("content") or answer["description"] or code == "204", (name, code)
        errors = {code: answer for code, answer in responses.items() if code[0] in "45"}
        takes_input = {"parameters", "requestBody", "security"} & set(operation)
        if takes_input:  # only an open /_status takes nothing that could be refused
            assert any(code.startswith("4") for code in errors), name
        assert "503" in errors, name  # the database can always be away
        for code, answer in errors.items():
            schema = answer["content"]["application/json"]["schema"]
            assert schema["$ref"].rpartition("/")[2] in ERROR_SCHEMAS, (name, code)


def test_bodies_are_typed_and_parameters_declared(generated):
    for name, operation in operations(generated.schema):
        for media in operation.get("requestBody", {}).get("content", {}).values():
            assert media.get("schema"), name
        path = name.partition(" ")[2]
        in_path = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
        assert in_path == set(re.findall(r"{(\w+)}", path)), name


def test_credentials_come_with_their_refusals(generated):
    for name, operation in operations(generated.schema):
        headers = {p["name"] for p in operation.get("parameters", []) if p["in"] == "header"}
        if "security" in operation or any(h.endswith("-Token") for h in headers):
            assert {"401", "403"} <= set(operation["responses"]), name


def test_paginated_lists_take_their_cursors(generated):
    for name, operation in operations(generated.schema):
        body = operation["responses"].get("200", {})
        schema = body.get("content", {}).get("application/json", {}).get("schema", {})
        component = schema.get("$ref", "").rpartition("/")[2]
        properties = generated.schema["components"]["schemas"].get(component, {}).get("properties")
        if properties and "Pages" in properties:
            queries = {p["name"] for p in operation.get("parameters", []) if p["in"] == "query"}
            assert {"next", "previous"} <= queries, name
