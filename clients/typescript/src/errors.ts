/**
 * Every refusal of the broker, and every failure to reach it, is a BrokerError: `status` is the
 * HTTP status (null when no answer came) and `message` the broker's own explanation (its
 * `{"Error": …}` text), so callers can branch on the class or the status and show the message.
 */

/** A refusal of the broker (any non-2xx answer) or a failure to reach it. */
export class BrokerError extends Error {
  /** The HTTP status, or null when the broker could not be reached. */
  readonly status: number | null;
  /** The answer's body: its parsed JSON when it was JSON, else its text (empty when none). */
  readonly body: unknown;
  /** The broker's Retry-After in milliseconds, when it sent one (429, 503). */
  retryAfterMs: number | null = null;

  constructor(status: number | null, message: string, body: unknown = "", options?: ErrorOptions) {
    super(message, options);
    this.name = new.target.name;
    this.status = status;
    this.body = body;
  }

  /** "HTTP 404: Channel not found", or "Broker unreachable: …" when no answer came. */
  override toString(): string {
    return this.status === null
      ? `Broker unreachable: ${this.message}`
      : `HTTP ${this.status}: ${this.message}`;
  }
}

/** 400, 413, 415 and 422: the request itself is wrong; retrying it will not help. */
export class BadRequest extends BrokerError {}
/** 401 and 403: a missing or wrong token or admin credential. */
export class Unauthorized extends BrokerError {}
/** 404: no such channel, producer, consumer, message or job. */
export class NotFound extends BrokerError {}
/** 409: the resource is in a state that forbids the request (a duplicate message ID, …). */
export class Conflict extends BrokerError {}
/** 412: a precondition failed (a stale If-Unmodified-Since, a schedule too soon). */
export class PreconditionFailed extends BrokerError {}
/** 429: over a rate limit; `retryAfterMs` says when to come back, when the broker said. */
export class RateLimited extends BrokerError {}
/** 5xx: the broker failed or is unavailable (its database, its storage). */
export class ServerError extends BrokerError {}
/** No answer: the connection failed, or the request timed out. `status` is null. */
export class BrokerUnavailable extends BrokerError {}

/** The error class that stands for an HTTP status. */
export function errorClassFor(status: number): typeof BrokerError {
  if (status === 401 || status === 403) return Unauthorized;
  if (status === 404) return NotFound;
  if (status === 409) return Conflict;
  if (status === 412) return PreconditionFailed;
  if (status === 429) return RateLimited;
  if (status >= 500) return ServerError;
  if (status >= 400) return BadRequest;
  return BrokerError;
}

/** The broker's message in an error body: `Error` (its own), `error` or `detail`, else the text. */
export function messageOf(body: unknown, status: number): string {
  if (typeof body === "object" && body !== null) {
    const fields = body as Record<string, unknown>;
    for (const key of ["Error", "error", "detail"]) {
      const value = fields[key];
      if (typeof value === "string" && value !== "") return value;
    }
  }
  if (typeof body === "string" && body.trim() !== "") return body.trim();
  return `the broker answered ${status} without an explanation`;
}
