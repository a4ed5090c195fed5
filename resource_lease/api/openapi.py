"""The API's OpenAPI 3.1 document (``GET openapi.json``), written out by hand: the views are
plain async Django views, and the document is the contract of docs/http.md."""

from __future__ import annotations

from typing import Any

from resource_lease.api.bodies import MAX_KEY, MAX_WAIT

_ERROR = {
    "type": "object",
    "properties": {"error": {"type": "string"}, "field": {"type": "string"}},
    "required": ["error"],
}
_LEASE = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "description": "Opaque; any server process of the project answers for it."},
        "kind": {"type": "string"},
        "name": {"type": ["string", "null"]},
        "data": {},
        "fence": {
            "type": "integer",
            "description": "Strictly greater than every fence granted before for the resource.",
        },
        "expires_at": {
            "type": ["string", "null"],
            "format": "date-time",
            "description": "By the database's clock, UTC.",
        },
        "holder": {"type": "string", "description": "http:<token name>:<holder or ->:<nonce>"},
        "ttl": {"type": "number"},
    },
    "required": ["id", "kind", "name", "data", "fence", "expires_at", "holder", "ttl"],
}


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_COMMON = {
    "400": _error("Bad input: `field` names what was wrong; nothing was written."),
    "401": _error("No token, or an unknown or revoked one."),
    "403": _error("A kind outside the token's kinds, or another token's lease."),
}
_LEASE_REF = {"$ref": "#/components/schemas/Lease"}
_ID = [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}]


def _body(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    return {"required": bool(required), "content": {"application/json": {"schema": schema}}}


def document(server: str) -> dict[str, Any]:
    """The document, with ``server`` (the API's base URL) as its server."""
    seconds = {"type": "number", "exclusiveMinimum": 0}
    return {
        "openapi": "3.1.0",
        "info": {"title": "resource_lease: lease over HTTP", "version": "1"},
        "servers": [{"url": server}],
        "security": [{"bearer": []}],
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": _ERROR, "Lease": _LEASE},
        },
        "paths": {
            "/leases": {
                "post": {
                    "summary": "Lease a resource of a kind, waiting up to `wait` seconds in line",
                    "requestBody": _body(
                        {
                            "kind": {"type": "string"},
                            "ttl": seconds,
                            "wait": {"type": "number", "minimum": 0, "maximum": MAX_WAIT},
                            "where": {"type": "object"},
                            "priority": {"type": "integer"},
                            "target": {
                                "type": "string",
                                "maxLength": 200,
                                "description": "What the resource is for: only one not cooling down for it is granted.",
                            },
                            "session": {
                                "type": "string",
                                "maxLength": 200,
                                "description": "A sticky session: the resource bound to it, waited for if another holds it.",
                            },
                            "holder": {"type": "string", "maxLength": 100},
                            "idempotency_key": {"type": "string", "maxLength": MAX_KEY},
                        },
                        ["kind"],
                    ),
                    "responses": {
                        "201": _json(
                            _LEASE_REF, "The lease (a replay of an idempotency key's: `Idempotent-Replayed`)."
                        ),
                        "404": _error("The kind has no resources at all."),
                        "410": _error("The idempotency key's lease is no longer held."),
                        "413": _error("The body is too large."),
                        "423": _error("None in time; `Retry-After` says when to ask again."),
                        **_COMMON,
                    },
                }
            },
            "/leases/{id}": {
                "get": {
                    "summary": "Read one lease",
                    "parameters": _ID,
                    "responses": {
                        "200": _json(
                            {"allOf": [_LEASE_REF, {"properties": {"held": {"type": "boolean"}}}]}, "The lease."
                        ),
                        "404": _error("Not an id this project gave out."),
                        **_COMMON,
                    },
                }
            },
            "/leases/{id}/renew": {
                "post": {
                    "summary": "Extend the lease by ttl from now",
                    "parameters": _ID,
                    "requestBody": _body({"ttl": seconds}),
                    "responses": {"200": _json(_LEASE_REF, "The lease."), "410": _error("No longer held."), **_COMMON},
                }
            },
            "/leases/{id}/release": {
                "post": {
                    "summary": "Give the resource back",
                    "parameters": _ID,
                    "requestBody": _body(
                        {
                            "cooldown": {
                                **seconds,
                                "description": "Seconds before the resource is granted for the lease's target again"
                                " (a lease with a target only; default: the policy's).",
                            }
                        }
                    ),
                    "responses": {
                        "200": _json({"type": "object", "properties": {"released": {"type": "boolean"}}}, "Released?"),
                        **_COMMON,
                    },
                }
            },
            "/leases/{id}/report": {
                "post": {
                    "summary": "Report how the resource did: its shared health (lease.report)",
                    "parameters": _ID,
                    "requestBody": _body(
                        {"outcome": {"enum": ["ok", "error", "blocked"]}, "retry_after": seconds}, ["outcome"]
                    ),
                    "responses": {"200": {"description": "Recorded."}, "410": _error("No longer held."), **_COMMON},
                }
            },
            "/pools": {
                "get": {
                    "summary": "Each pool's counts",
                    "responses": {
                        "200": _json(
                            {"type": "object"}, "`{pools: [{kind, free, held, quarantined, disabled, waiting}]}`"
                        )
                    },
                }
            },
            "/openapi.json": {
                "get": {"summary": "This document", "security": [], "responses": {"200": {"description": "OK"}}}
            },
        },
    }
