"""``ApiError``: every answer of the API that is not a success, as JSON."""

from __future__ import annotations

from typing import Any

from django.http import JsonResponse


class ApiError(Exception):
    """An answer other than success: ``status``, an ``error`` message, the ``field`` at fault
    (bad input) and extra ``headers`` (``Retry-After``, ``WWW-Authenticate``)."""

    def __init__(
        self, status: int, error: str, *, field: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.field = field
        self.headers = headers or {}

    def response(self) -> JsonResponse:
        body: dict[str, Any] = {"error": self.error}
        if self.field is not None:
            body["field"] = self.field
        response = JsonResponse(body, status=self.status)
        for name, value in self.headers.items():
            response[name] = value
        return response


def bad_request(field: str, error: str) -> ApiError:
    """400 naming the field."""
    return ApiError(400, error, field=field)
