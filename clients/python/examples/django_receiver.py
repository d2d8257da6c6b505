"""A Django view that receives the broker's push deliveries and checks their signature.

Route it in urls.py: `path("hooks/orders", receive_webhook)`. The secret is the consumer's
(`Admin.signing_secret(channel, consumer)["SigningSecret"]`, or the operator UI), kept in the
environment rather than the code.
"""

from __future__ import annotations

import os

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from webhook_broker_client import WebhookVerificationError, verify

SIGNING_SECRET = os.environ["WEBHOOK_SIGNING_SECRET"]


@csrf_exempt  # the signature, not a CSRF token, proves where the request comes from
@require_POST
def receive_webhook(request: HttpRequest) -> HttpResponse:
    try:
        # The raw body, exactly as received: a parsed and re-encoded one would not verify.
        verify(request.headers, request.body, SIGNING_SECRET)
    except WebhookVerificationError as refused:
        return HttpResponse(str(refused), status=400, content_type="text/plain")
    handle(request.headers["webhook-id"], request.body)
    return HttpResponse(status=204)  # any 2xx: delivered


def handle(message_id: str, body: bytes) -> None:
    """Your work. A retried delivery has the same webhook-id: deduplicate by it."""
