"""Content negotiation that skips the work when there is nothing to choose."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request


class SingleRendererFirst(DefaultContentNegotiation):
    """The API views render only JSON: skip parsing the Accept header on every request
    (broadcast is the hot path). Views with several renderers (the schema) negotiate as usual."""

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: Any = None
    ) -> tuple[BaseRenderer, str]:
        renderers = list(renderers)
        if len(renderers) == 1:
            return renderers[0], renderers[0].media_type
        renderer, media_type = super().select_renderer(request, renderers, format_suffix)
        return renderer, str(media_type)
