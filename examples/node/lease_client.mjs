// A client of resource_lease's HTTP API for Node 20+ (its built-in fetch; no packages).
// See docs/http.md. Usage:
//
//   import { LeaseClient } from "./lease_client.mjs";
//   const client = new LeaseClient("http://127.0.0.1:8000/lease/api/", process.env.RESOURCE_LEASE_TOKEN);
//   await client.withLease("proxy", { ttl: 30, wait: 60 }, async (lease) => {
//     await crawl(lease.data.url, lease.fence);
//   });

export class ApiError extends Error {
  constructor(status, error, field, retryAfter) {
    super(`${status}: ${error}${field ? ` (field ${field})` : ""}`);
    this.status = status; // 423: none in time; 410: the lease is gone; 0: the server could not be reached
    this.error = error;
    this.field = field;
    this.retryAfter = retryAfter;
  }
}

export class LeaseClient {
  constructor(url, token, { timeout = 30 } = {}) {
    this.url = url.endsWith("/") ? url : url + "/";
    this.token = token;
    this.timeout = timeout;
  }

  async request(method, path, body, waitSeconds = 0) {
    let response;
    try {
      response = await fetch(this.url + path, {
        method,
        headers: { Authorization: `Bearer ${this.token}`, "Content-Type": "application/json" },
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout((this.timeout + waitSeconds) * 1000),
      });
    } catch (cause) {
      throw new ApiError(0, `cannot reach ${this.url}: ${cause.message}`);
    }
    const text = await response.text();
    let data = {};
    try {
      data = text ? JSON.parse(text) : {};
    } catch {
      data = { error: text };
    }
    if (!response.ok) {
      const retry = response.headers.get("retry-after");
      throw new ApiError(response.status, data.error ?? response.statusText, data.field, retry ? Number(retry) : undefined);
    }
    return data;
  }

  // The lease: {id, kind, name, data, fence, expires_at, holder, ttl}; ApiError 423 when none in time.
  acquire(kind, { ttl, wait = 0, where, priority, holder, idempotencyKey } = {}) {
    const body = { kind, wait };
    if (ttl !== undefined) body.ttl = ttl;
    if (where !== undefined) body.where = where;
    if (priority !== undefined) body.priority = priority;
    if (holder !== undefined) body.holder = holder;
    if (idempotencyKey !== undefined) body.idempotency_key = idempotencyKey;
    return this.request("POST", "leases", body, wait);
  }

  renew(id, ttl) {
    return this.request("POST", `leases/${id}/renew`, ttl === undefined ? {} : { ttl });
  }

  async release(id) {
    return (await this.request("POST", `leases/${id}/release`, {})).released;
  }

  get(id) {
    return this.request("GET", `leases/${id}`);
  }

  async pools() {
    return (await this.request("GET", "pools")).pools;
  }

  // Run fn(lease) holding a lease, renewed every ttl/3; released after fn, even if it throws.
  // A renewal answered 410 aborts lease.signal (an AbortSignal fn can pass to its own work).
  async withLease(kind, options, fn) {
    const lease = await this.acquire(kind, options);
    const lost = new AbortController();
    lease.signal = lost.signal;
    const timer = setInterval(() => {
      this.renew(lease.id).catch((error) => {
        if (error.status === 410) lost.abort(error);
      });
    }, (lease.ttl * 1000) / 3);
    try {
      return await fn(lease);
    } finally {
      clearInterval(timer);
      await this.release(lease.id).catch(() => false);
    }
  }
}
