"""Lease over HTTP: a JSON API served by the app (docs/http.md).

Mount it with one line: ``path("lease/api/", include("resource_lease.api.urls"))``.

``errors``   ``ApiError``: an answer other than success (status, message, the field at fault)
``bodies``   each request's JSON, checked field by field (400 naming the field, nothing written)
``tokens``   bearer tokens: made, revoked, checked (401, 403), the failed-authentication metric
``ids``      a lease's opaque id: its row, fence and holder, signed (no lease kept in memory)
``keys``     idempotency keys: a retried acquire finds its grant again, never a second one
``views``    the async views, on the asyncio API (``aacquire``); they also run under WSGI
``openapi``  the OpenAPI document served at ``openapi.json``
"""
