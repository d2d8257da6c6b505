"""Template tags of the operator UI's filter forms (docs/ui.md, "Accessibility"): a field whose
value is refused is marked invalid and described by its line in templates/ui/filter_errors.html,
so that a screen reader says what is wrong when the field is reached, as the page shows it."""

from __future__ import annotations

from django import forms, template
from django.utils.html import format_html
from django.utils.safestring import SafeString

register = template.Library()


@register.filter
def filter_error_id(name: str) -> str:
    """The id of the line of filter_errors.html about the field `name`."""
    return f"filter-error-{name}"


@register.simple_tag
def error_attributes(form: forms.Form, name: str) -> SafeString:
    """`aria-invalid` and `aria-describedby` for the input of field `name` when `form` refused
    its value; nothing otherwise (written inside the input's tag)."""
    if name not in form.errors:
        return SafeString("")
    return format_html(' aria-invalid="true" aria-describedby="{}"', filter_error_id(name))
