/**
 * The one place that builds URLs, sends requests, turns a non-2xx answer into a BrokerError and
 * holds the retry rule. Producer and Admin both send through it.
 */
import { BrokerError, BrokerUnavailable, errorClassFor, messageOf } from "./errors.js";

/**
 * When to try again. A request is retried after a connection failure or timeout and after a 5xx
 * or 429 answer, at most `tries` times in all (the first included). Between tries it waits the
 * answer's Retry-After when it has one, whatever the status (a 429, a 503 while the broker's
 * database is down; longer than `maxRetryAfterMs`: it gives up at once and throws), else an
 * exponential delay from `initialDelayMs` doubling up to `maxDelayMs`, drawn between half and all
 * of it (jitter), so clients that failed together do not all come back at the same moment.
 * GET, PUT and DELETE are retried; a POST only when its sender says it is safe to repeat (a
 * publish). The same rule as the Python client's (its _http.py).
 */
export interface RetryPolicy {
  tries: number;
  initialDelayMs: number;
  maxDelayMs: number;
  maxRetryAfterMs: number;
}

export const DEFAULT_RETRY: RetryPolicy = {
  tries: 5,
  initialDelayMs: 200,
  maxDelayMs: 5_000,
  maxRetryAfterMs: 60_000,
};

export interface ClientOptions {
  /** How long one try may take, answer included, before it counts as a failure (default 30 s). */
  timeoutMs?: number;
  /** Changes to DEFAULT_RETRY. `{tries: 1}` turns retries off. */
  retry?: Partial<RetryPolicy>;
}

type QueryValue = string | number | boolean | undefined | readonly string[];

export interface RequestSpec {
  method: "GET" | "PUT" | "POST" | "DELETE";
  /** A path below the base URL (build it with `path`), or a whole URL (a resolved `Pages` link). */
  path: string;
  query?: Record<string, QueryValue>;
  headers?: Record<string, string>;
  body?: string | Uint8Array | URLSearchParams;
  /** Whether the retry rule applies; default: for GET, PUT and DELETE, whose repetition does
   * nothing twice, not for POST (a command may not be repeatable). */
  retry?: boolean;
}

export interface Answer {
  status: number;
  headers: Headers;
  /** Parsed JSON when the answer is JSON, else its text. */
  body: unknown;
}

/** A URL path whose interpolated parts are percent-encoded: path`/channel/${id}`. */
export function path(strings: TemplateStringsArray, ...parts: readonly string[]): string {
  return strings.reduce(
    (built, literal, index) =>
      built + literal + (index < parts.length ? encodeURIComponent(parts[index] ?? "") : ""),
    "",
  );
}

export class HttpClient {
  readonly baseUrl: string;
  readonly retry: RetryPolicy;
  private readonly timeoutMs: number;
  private readonly authHeaders: Record<string, string>;

  constructor(baseUrl: string, authHeaders: Record<string, string>, options: ClientOptions = {}) {
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.authHeaders = authHeaders;
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.retry = { ...DEFAULT_RETRY, ...options.retry };
    if (!Number.isInteger(this.retry.tries) || this.retry.tries < 1) {
      throw new RangeError("retry.tries must be an integer of at least 1");
    }
  }

  /** Sends the request, retrying as the policy says; throws a BrokerError for any non-2xx. */
  async send(spec: RequestSpec): Promise<Answer> {
    const tries = (spec.retry ?? spec.method !== "POST") ? this.retry.tries : 1;
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.sendOnce(spec);
      } catch (error) {
        if (attempt >= tries || !isRetryable(error)) throw error;
        const delay = this.delayBefore(attempt, error as BrokerError);
        if (delay === null) throw error;
        await sleep(delay);
      }
    }
  }

  /**
   * The whole URL of a broker's `Pages` link. The broker writes links as absolute paths that
   * already hold any prefix it is served under (`/broker/channels?next=…`), so they resolve
   * against the base URL's origin, not its path. The Python client's `resolve_link` too.
   */
  resolveLink(link: string): string {
    return new URL(link, this.baseUrl).href;
  }

  private urlOf(spec: Pick<RequestSpec, "path" | "query">): URL {
    const whole = /^https?:\/\//.test(spec.path);
    const url = new URL(whole ? spec.path : this.baseUrl + spec.path);
    for (const [key, value] of Object.entries(spec.query ?? {})) {
      if (value === undefined) continue;
      const values = Array.isArray(value) ? value : [String(value)];
      for (const one of values) url.searchParams.append(key, one);
    }
    return url;
  }

  private async sendOnce(spec: RequestSpec): Promise<Answer> {
    let response: Response;
    try {
      response = await fetch(this.urlOf(spec), {
        method: spec.method,
        headers: { Accept: "application/json", ...this.authHeaders, ...spec.headers },
        body: spec.body ?? null,
        signal: AbortSignal.timeout(this.timeoutMs),
        redirect: "manual",
      });
    } catch (error) {
      throw new BrokerUnavailable(null, describeFailure(error, this.timeoutMs), "", {
        cause: error,
      });
    }
    const body = await readBody(response);
    if (response.ok) return { status: response.status, headers: response.headers, body };
    throw refusal(response, body);
  }

  /** Milliseconds to wait after `attempt` failed tries, or null: a Retry-After too long to wait. */
  private delayBefore(attempt: number, error: BrokerError): number | null {
    const retryAfter = error.retryAfterMs;
    if (retryAfter !== null) return retryAfter <= this.retry.maxRetryAfterMs ? retryAfter : null;
    const ceiling = Math.min(this.retry.maxDelayMs, this.retry.initialDelayMs * 2 ** (attempt - 1));
    return ceiling / 2 + Math.random() * (ceiling / 2);
  }
}

/** Connection failures, timeouts, 5xx and 429: what another try may well get through. */
export function isRetryable(error: unknown): boolean {
  if (!(error instanceof BrokerError)) return false;
  return error.status === null || error.status === 429 || error.status >= 500;
}

function refusal(response: Response, body: unknown): BrokerError {
  const ErrorClass = errorClassFor(response.status);
  const error = new ErrorClass(response.status, messageOf(body, response.status), body);
  error.retryAfterMs = parseRetryAfter(response.headers.get("Retry-After"));
  return error;
}

/** Retry-After as milliseconds from now: delay-seconds or an HTTP date (RFC 9110). */
export function parseRetryAfter(value: string | null): number | null {
  if (value === null || value.trim() === "") return null;
  if (/^\d+$/.test(value.trim())) return Number(value.trim()) * 1000;
  const when = Date.parse(value);
  return Number.isNaN(when) ? null : Math.max(0, when - Date.now());
}

async function readBody(response: Response): Promise<unknown> {
  const text = await response.text();
  const type = response.headers.get("Content-Type") ?? "";
  if (text === "" || !/[/+]json\b/.test(type)) return text;
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return text; // A proxy's page mislabelled as JSON: keep it as text for the message.
  }
}

function describeFailure(error: unknown, timeoutMs: number): string {
  if (error instanceof DOMException && error.name === "TimeoutError") {
    return `no answer within ${timeoutMs} ms`;
  }
  const cause = error instanceof Error ? (error.cause ?? error) : error;
  return cause instanceof Error ? cause.message : String(cause);
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
