"""The API's views (docs/http.md): async, on the app's asyncio API, so a long poll holds a
place in line and no thread; under WSGI Django runs them in an event loop of their own.

Each view answers JSON. The order of the checks is the same everywhere: the token (401), the
lease's id (404) and whose it is (403), the body (400 naming the field), then the database.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import secrets
from typing import Any

from django.db.models import Count, DurationField, ExpressionWrapper, F
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from resource_lease import health, pool, targets
from resource_lease.api import bodies, keys
from resource_lease.api.errors import ApiError
from resource_lease.api.ids import LeaseRef
from resource_lease.api.openapi import document
from resource_lease.api.reporting import ReportedGrant
from resource_lease.api.tokens import allow_kind, authenticate, orm
from resource_lease.conf import lease_settings
from resource_lease.db.clock import DbNow
from resource_lease.db.operations import ops
from resource_lease.exceptions import LeaseDatabaseError, LeaseError, LeaseLost, NoResourceAvailable
from resource_lease.lease import Lease, aacquire, hand_over
from resource_lease.line.wakeups import release as release_row
from resource_lease.models import COORDINATION_PREFIX, Resource, Waiter
from resource_lease.models.api import ApiToken, http_holder
from resource_lease.offload import in_thread

logger = logging.getLogger("resource_lease")

#: How often a request waiting for another attempt's claim on its idempotency key looks again.
CLAIM_POLL = 0.25


def _alias() -> str:
    return str(lease_settings.DATABASE)


def _time(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def _lease_json(ref: LeaseRef, *, name: str | None, data: Any, expires_at: dt.datetime | None) -> dict[str, Any]:
    return {
        "id": ref.dumps(),
        "kind": ref.kind,
        "name": name,
        "data": data,
        "fence": ref.fence,
        "expires_at": None if expires_at is None else _time(expires_at),
        "holder": ref.holder,
        "ttl": ref.ttl,
        "target": ref.target,
    }


def _session_json(lease: Lease) -> dict[str, Any]:
    return {"session": lease.session, "rebound": lease.rebound}


def _answer(view: Any) -> Any:
    """``ApiError`` and the engine's database errors as JSON answers."""

    async def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            response: HttpResponse = await view(request, *args, **kwargs)
            return response
        except ApiError as exc:
            return exc.response()
        except LeaseDatabaseError as exc:
            logger.warning("HTTP API: the database failed: %s", exc)
            return ApiError(503, f"the database failed: {exc}", headers={"Retry-After": "1"}).response()

    wrapped.__name__ = view.__name__
    wrapped.__doc__ = view.__doc__
    return csrf_exempt(wrapped)


def _body(request: HttpRequest) -> bytes:
    length = request.META.get("CONTENT_LENGTH") or "0"
    if length.isdigit() and int(length) > bodies.MAX_BODY:
        raise ApiError(413, f"the body is larger than {bodies.MAX_BODY} bytes", field="body")
    return request.body


def _row(pk: int) -> Resource | None:
    return Resource.objects.using(_alias()).filter(pk=pk).first()


def _retry_after(kind: str) -> int:
    """Seconds until the first lease of ``kind`` runs out (database clock), 1 to 60: when
    asking again may find one free."""
    left = (
        Resource.objects.using(_alias())
        .live()
        .filter(kind=kind)
        .annotate(left=ExpressionWrapper(F("busy_before") - DbNow(), output_field=DurationField()))
        .order_by("busy_before")
        .values_list("left", flat=True)
        .first()
    )
    seconds = left.total_seconds() if isinstance(left, dt.timedelta) else 1.0
    return max(1, min(60, int(seconds + 0.999)))


async def _grant(body: bodies.AcquireBody, holder: str, wait: float) -> Lease:
    """One grant from the line, as a Python caller's (``aacquire``), handed over to the client:
    this process neither renews it nor gives it back when it stops."""
    try:
        lease = await aacquire(
            body.kind,
            ttl=body.ttl,
            timeout=wait,
            holder=holder,
            where=body.where,
            priority=body.priority,
            target=body.target,
            session=body.session,
            using=_alias(),
        )
    except NoResourceAvailable as exc:
        if not exc.exists:
            raise ApiError(404, str(exc), field="kind") from exc
        retry = await orm(_retry_after, body.kind)
        raise ApiError(423, str(exc), headers={"Retry-After": str(retry)}) from exc
    except ValueError as exc:  # already checked: only a setting could make it so
        raise ApiError(400, str(exc)) from exc
    hand_over(lease)
    return lease


def _granted(lease: Lease, token: ApiToken, ttl: float) -> dict[str, Any]:
    ref = LeaseRef(
        lease.resource.pk, lease.fence, lease.holder, lease.kind, ttl, token.pk, lease.granted_level, lease.target
    )
    return _lease_json(ref, name=lease.resource.name, data=lease.resource.data, expires_at=lease.expires_at)


@_answer
@require_POST
async def leases(request: HttpRequest) -> HttpResponse:
    """``POST leases``: a lease of ``kind`` (201), waiting up to ``wait`` seconds in line."""
    token = await authenticate(request)
    body = bodies.AcquireBody.of(_body(request))
    allow_kind(token, body.kind)
    if body.idempotency_key is not None:
        return await _acquire_with_key(token, body)
    holder = http_holder(token.name, body.holder, secrets.token_hex(6))
    lease = await _grant(body, holder, body.wait)
    return JsonResponse({**_granted(lease, token, body.ttl), **_session_json(lease)}, status=201)


async def _acquire_with_key(token: ApiToken, body: bodies.AcquireBody) -> HttpResponse:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + body.wait
    while True:
        claim: keys.Claim = await orm(keys.claim, token, body)
        if claim.state == "granted":
            return await _replay(claim, token, body)
        if claim.state == "claimed":
            break
        left = deadline - loop.time()
        if left <= 0:
            raise keys.refuse_busy(await orm(keys.claim_left, claim.row))
        await asyncio.sleep(min(CLAIM_POLL, left))
    keeping = asyncio.ensure_future(_keep_claim(claim, body.ttl))
    lease: Lease | None = None
    try:
        lease = await _grant(body, claim.holder, max(0.0, deadline - loop.time()))
    finally:
        keeping.cancel()
        if lease is None:
            await asyncio.shield(orm(keys.let_go, claim.row, claim.attempt))
    recorded = await asyncio.shield(orm(keys.record, claim.row, claim.attempt, lease.resource.pk, lease.fence))
    if not recorded:
        await asyncio.shield(in_thread(_give_back, lease.resource.pk, lease.holder, lease.fence, lease.kind))
        raise ApiError(409, "another request with this idempotency_key took it over meanwhile", field="idempotency_key")
    return JsonResponse({**_granted(lease, token, body.ttl), **_session_json(lease)}, status=201)


async def _keep_claim(claim: keys.Claim, ttl: float) -> None:
    while True:
        await asyncio.sleep(ttl / 3)
        try:
            if not await orm(keys.refresh, claim.row, claim.attempt, ttl):
                logger.warning("HTTP API: the claim on idempotency key row %s was taken over", claim.row)
                return
        except Exception as exc:  # noqa: BLE001 - the next refresh tries again; record() decides
            logger.warning("HTTP API: refreshing the claim on idempotency key row %s failed: %s", claim.row, exc)


async def _replay(claim: keys.Claim, token: ApiToken, body: bodies.AcquireBody) -> HttpResponse:
    assert claim.pk is not None and claim.fence is not None
    ref = LeaseRef(claim.pk, claim.fence, claim.holder, body.kind, body.ttl, token.pk, target=body.target)
    held = await in_thread(ops(_alias()).is_held, pk=ref.pk, holder=ref.holder, fence=ref.fence)
    row = await orm(_row, ref.pk) if held else None
    if row is None:
        raise ApiError(410, "the lease granted for this idempotency_key is no longer held", field="idempotency_key")
    response = JsonResponse(_lease_json(ref, name=row.name, data=row.data, expires_at=row.busy_before), status=201)
    response["Idempotent-Replayed"] = "true"
    return response


def _give_back(pk: int, holder: str, fence: int, kind: str) -> bool:
    alias = _alias()
    name = Resource.objects.using(alias).filter(pk=pk).values_list("name", flat=True).first()
    return release_row(ops(alias), alias, kind, name or "", pk=pk, holder=holder, fence=fence)


async def _owned(request: HttpRequest, lease_id: str) -> tuple[ApiToken, LeaseRef]:
    token = await authenticate(request)
    ref = LeaseRef.loads(lease_id)
    if ref.token_id != token.pk:
        raise ApiError(403, "this lease was taken with another token", field="id")
    allow_kind(token, ref.kind)
    return token, ref


@_answer
@require_POST
async def renew(request: HttpRequest, lease_id: str) -> HttpResponse:
    """``POST leases/<id>/renew``: extend by ``ttl`` (default the lease's) from now; 410 if lost."""
    _token, ref = await _owned(request, lease_id)
    ttl = bodies.renew_ttl(_body(request))
    if ttl is not None:
        ref = dataclasses.replace(ref, ttl=ttl)
    expiry = await in_thread(ops(_alias()).renew, pk=ref.pk, holder=ref.holder, fence=ref.fence, ttl=ref.ttl)
    if expiry is None:
        raise ApiError(410, "the lease is no longer held (it expired or was released)", field="id")
    row = await orm(_row, ref.pk)
    return JsonResponse(
        _lease_json(
            ref, name=None if row is None else row.name, data=None if row is None else row.data, expires_at=expiry
        )
    )


@_answer
@require_POST
async def release(request: HttpRequest, lease_id: str) -> HttpResponse:
    """``POST leases/<id>/release``: ``{"released": bool}`` (False: it was no longer held);
    ``cooldown``: seconds before the resource is granted for the lease's target again (default:
    the policy's; docs/learning.md#targets)."""
    _token, ref = await _owned(request, lease_id)
    cooldown = bodies.release_body(_body(request))
    if cooldown is not None and ref.target is None:
        raise ApiError(400, "cooldown goes with a lease acquired with a target", field="cooldown")
    if ref.target is not None:
        policy = await in_thread(health.policy_of, _alias(), ref.kind)
        seconds = cooldown if cooldown is not None else policy.cooldown
        if seconds > 0 or policy.target_rate is not None:
            # The cooldown, and under target_rate the grant's time moved to now: the window
            # counts each use from its release (docs/learning.md#targets).
            now = (await in_thread(pool.database_now, _alias())).timestamp()
            try:
                await in_thread(targets.used_elsewhere, ReportedGrant(ref, _alias()), seconds, policy.target_rate, now)
            except LeaseLost:
                return JsonResponse({"released": False})
    released = await in_thread(_give_back, ref.pk, ref.holder, ref.fence, ref.kind)
    return JsonResponse({"released": released})


@_answer
@require_POST
async def report(request: HttpRequest, lease_id: str) -> HttpResponse:
    """``POST leases/<id>/report``: how the resource did (``Lease.report``: its shared health,
    docs/learning.md#health), one fenced statement; 410 if the lease is no longer held."""
    _token, ref = await _owned(request, lease_id)
    outcome, retry_after = bodies.report_body(_body(request))
    try:
        await in_thread(health.report, ReportedGrant(ref, _alias()), outcome, retry_after)
    except LeaseLost as exc:
        raise ApiError(410, "the lease is no longer held (it expired or was released)", field="id") from exc
    except LeaseError as exc:  # a lock's, semaphore's or election's row has no health
        raise ApiError(400, str(exc), field="id") from exc
    return JsonResponse({})


@_answer
@require_GET
async def lease_detail(request: HttpRequest, lease_id: str) -> HttpResponse:
    """``GET leases/<id>``: ``{"held": bool, ...the lease}``, asked of the database."""
    _token, ref = await _owned(request, lease_id)
    held = await in_thread(ops(_alias()).is_held, pk=ref.pk, holder=ref.holder, fence=ref.fence)
    row = await orm(_row, ref.pk)
    expires_at = row.busy_before if (held and row is not None) else None
    body = _lease_json(
        ref, name=None if row is None else row.name, data=None if row is None else row.data, expires_at=expires_at
    )
    return JsonResponse({"held": held, **body})


def _pools(token: ApiToken) -> list[dict[str, Any]]:
    counts = pool.counts(using=_alias())
    waiting = dict(
        Waiter.objects.using(_alias())
        .live()
        .filter(name="")
        .exclude(kind__startswith=COORDINATION_PREFIX)
        .order_by()
        .values_list("kind")
        .annotate(n=Count("pk"))
        .values_list("kind", "n")
    )
    return [
        {
            "kind": kind,
            "free": states["free"] + states["expired"],
            "held": states["held"],
            "quarantined": states["quarantined"],
            "disabled": states["disabled"],
            "waiting": waiting.get(kind, 0),
        }
        for kind, states in counts.items()
        if token.allows(kind)
    ]


@_answer
@require_GET
async def pools(request: HttpRequest) -> HttpResponse:
    """``GET pools``: each pool's counts (those of the token's kinds)."""
    token = await authenticate(request)
    return JsonResponse({"pools": await orm(_pools, token)})


@require_GET
def openapi(request: HttpRequest) -> HttpResponse:
    """``GET openapi.json``: the API's OpenAPI document (no token needed)."""
    return JsonResponse(document(request.build_absolute_uri("./").rstrip("/")))
