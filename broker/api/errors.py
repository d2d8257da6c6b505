"""One error shape for the whole API: `{"Error": "<message>"}` with a 4xx/5xx status.

Views raise `ApiError` (or a DRF exception); domain errors (publishing, state machine) are mapped
here, in one place. A database that does not answer gives 503, never a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig, TooManyFieldsSent
from django.db import DataError, InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response

from broker import payloads, publishing
from broker.ratelimit import RateLimited
from broker.schema_allowance import OverAllowance
from broker.storable_text import UnstorableText
from jobs.states import ForbiddenTransition

logger = logging.getLogger(__name__)


class ApiError(exceptions.APIException):
    """An error answered as `{"Error": message}` with the given status code."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code


DOMAIN_ERRORS: dict[type[Exception], int] = {
    publishing.UnknownChannel: status.HTTP_404_NOT_FOUND,
    publishing.UnknownProducer: status.HTTP_401_UNAUTHORIZED,
    # Only when a token changed between the publish statement and the broadcast's own check.
    publishing.TokensRefused: status.HTTP_403_FORBIDDEN,
    # BROKER_PRODUCER_CHANNELS=bound: the tokens are right, the channel is not the producer's.
    publishing.ProducerNotAllowed: status.HTTP_403_FORBIDDEN,
    publishing.DuplicateMessage: status.HTTP_409_CONFLICT,
    publishing.PayloadTooLarge: status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
    publishing.ScheduleTooSoon: status.HTTP_412_PRECONDITION_FAILED,
    publishing.InvalidMessage: status.HTTP_400_BAD_REQUEST,
    ForbiddenTransition: status.HTTP_400_BAD_REQUEST,
    payloads.PayloadNotStored: status.HTTP_507_INSUFFICIENT_STORAGE,
    # A lone surrogate or a NUL where the database cannot keep it, named by its field.
    UnstorableText: status.HTTP_400_BAD_REQUEST,
}


# Modules whose frames in a traceback mean "while decoding a JSON request body".
JSON_DECODERS = {"json.decoder", "rest_framework.parsers"}


def error_response(status_code: int, message: str) -> JsonResponse:
    return JsonResponse({"Error": message}, status=status_code)


def handle_exception(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's EXCEPTION_HANDLER: every expected failure becomes a clean JSON error."""
    if isinstance(exc, Http404):
        return _response(status.HTTP_404_NOT_FOUND, "Request resource not found.")
    if isinstance(exc, DataError):
        # A value the database cannot store (a NUL byte, a number out of range) that got past
        # validation: still the client's input, so a 400 and not a 500.
        logger.warning("database refused a value: %s", type(exc).__name__)
        return _response(status.HTTP_400_BAD_REQUEST, "A value in the request cannot be stored.")
    if isinstance(exc, PermissionDenied):
        return _response(status.HTTP_403_FORBIDDEN, str(exc) or "Permission denied.")
    if isinstance(exc, RequestDataTooBig):
        # Django refuses by the declared Content-Length, before reading the body.
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return _response(
            status.HTTP_413_REQUEST_ENTITY_TOO_LARGE, f"The request body is over {limit} bytes."
        )
    if isinstance(exc, TooManyFieldsSent):
        limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
        return _response(status.HTTP_400_BAD_REQUEST, f"More than {limit} form fields.")
    if isinstance(exc, RateLimited | OverAllowance):
        response = _response(status.HTTP_429_TOO_MANY_REQUESTS, str(exc))
        response["Retry-After"] = str(exc.retry_after)
        return response
    if isinstance(exc, RecursionError) and _raised_decoding_json(exc):
        # JSON nested thousands deep makes Python's decoder give up with RecursionError, which
        # DRF's JSONParser and views catching ValueError let through as a 500.
        return _response(status.HTTP_400_BAD_REQUEST, "The request body is nested too deeply.")
    for error_type, status_code in DOMAIN_ERRORS.items():
        if isinstance(exc, error_type):
            return _response(status_code, str(exc))
    if isinstance(exc, exceptions.APIException):
        response = _response(exc.status_code, _message(exc.detail))
        auth_header = getattr(exc, "auth_header", None)
        if auth_header:
            response["WWW-Authenticate"] = auth_header
        return response
    return None  # unexpected: DatabaseUnavailableMiddleware or Django's 500 handling


def _raised_decoding_json(exc: Exception) -> bool:
    """Whether `exc` came out of the JSON decoder (so from a request body, not from a bug)."""
    trace = exc.__traceback__
    while trace is not None:
        if trace.tb_frame.f_globals.get("__name__") in JSON_DECODERS:
            return True
        trace = trace.tb_next
    return False


def _response(status_code: int, message: str) -> Response:
    return Response({"Error": message}, status=status_code)


def _message(detail: Any) -> str:
    """Flatten DRF's nested error details into one readable sentence."""
    if isinstance(detail, dict):
        return "; ".join(f"{key}: {_message(value)}" for key, value in detail.items())
    if isinstance(detail, list):
        return " ".join(_message(item) for item in detail)
    return str(detail)


class DatabaseUnavailableMiddleware:
    """Answer 503 with a JSON error, not a traceback, while the database is unreachable."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        try:
            return self.get_response(request)
        except (OperationalError, InterfaceError) as exc:
            return self._unavailable(exc)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        if isinstance(exc, (OperationalError, InterfaceError)):
            return self._unavailable(exc)
        return None

    def _unavailable(self, exc: Exception) -> HttpResponse:
        logger.warning("database unavailable: %s", type(exc).__name__)
        response = error_response(503, "The database is unavailable; retry shortly.")
        response["Retry-After"] = "5"
        return response


def not_found(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return error_response(404, "Request resource not found.")


def server_error(request: HttpRequest) -> JsonResponse:
    return error_response(500, "Internal error; it has been logged.")


def bad_request(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return error_response(400, "Bad request.")


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return error_response(403, "Permission denied.")
