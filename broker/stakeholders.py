"""What producers, channels and consumers share when they are created or changed through a form
(the API's PUT, the operator UI, the admin)."""

from __future__ import annotations

from typing import Any


def apply_stakeholder_form(resource: Any, form: dict[str, str], *, default_name: str) -> None:
    """Set name and token from a PUT form (the response shows a token that was set).

    Creating without a token generates one; updating without a token keeps the current one, so a
    rename cannot silently invalidate every client's credentials.
    """
    creating = resource._state.adding
    if "name" in form or creating:
        resource.name = form.get("name") or default_name
    if form.get("token") or creating:
        resource.set_token(form.get("token") or None)
