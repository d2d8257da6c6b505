"""A FastAPI receiver for the broker's push deliveries, signature checked first.

Run: WEBHOOK_SIGNING_SECRET=whsec_... uvicorn fastapi_receiver:app --port 8080
"""

from __future__ import annotations

import os

from fastapi import FastAPI, HTTPException, Request, Response

from webhook_broker_client import WebhookVerificationError, verify

SIGNING_SECRET = os.environ["WEBHOOK_SIGNING_SECRET"]
app = FastAPI()


@app.post("/hooks/orders", status_code=204)
async def receive_webhook(request: Request) -> Response:
    body = await request.body()  # the raw bytes: not a model FastAPI parsed and re-encoded
    try:
        verify(request.headers, body, SIGNING_SECRET)
    except WebhookVerificationError as refused:
        raise HTTPException(status_code=400, detail=str(refused)) from None
    await handle(request.headers["webhook-id"], body)
    return Response(status_code=204)


async def handle(message_id: str, body: bytes) -> None:
    """Your work. A retried delivery has the same webhook-id: deduplicate by it."""
