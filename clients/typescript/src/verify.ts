/**
 * Checking a push delivery's Standard Webhooks signature, for receivers (docs/api.md, "Signing
 * secrets"). The broker sends `webhook-id` (the message ID), `webhook-timestamp` (unix seconds at
 * sending) and `webhook-signature`: space-separated `v1,<base64 HMAC-SHA256>` entries over
 * `{id}.{timestamp}.{body}`, keyed with the base64-decoded part of the consumer's `whsec_` secret.
 * During a secret rotation two entries come; one that matches is enough.
 */
import { createHmac, timingSafeEqual } from "node:crypto";

const SECRET_PREFIX = "whsec_";
const DEFAULT_TOLERANCE_SECONDS = 5 * 60;

/** Why a delivery was not accepted; `reason` is stable, for code to branch on. */
export class WebhookVerificationError extends Error {
  readonly reason:
    | "missing-header"
    | "invalid-timestamp"
    | "timestamp-too-old"
    | "timestamp-too-new"
    | "no-matching-signature"
    | "invalid-secret";

  constructor(reason: WebhookVerificationError["reason"], message: string) {
    super(message);
    this.name = "WebhookVerificationError";
    this.reason = reason;
  }
}

/** The request's headers: a fetch `Headers`, or Node's `IncomingHttpHeaders` (lower-case keys). */
export type WebhookHeaders = Headers | Record<string, string | readonly string[] | undefined>;

export interface VerifyOptions {
  /** How far the timestamp may be from now, either way (default 300 s, as Standard Webhooks). */
  toleranceSeconds?: number;
  /** The time to judge the timestamp by (default: now). */
  now?: Date;
}

export interface VerifiedWebhook {
  /** The message ID: the same on every retry, for deduplication. */
  id: string;
  /** When the broker sent this attempt. */
  timestamp: Date;
}

/**
 * Checks a delivery's signature and timestamp and returns its ID and time; throws a
 * WebhookVerificationError otherwise. `body` must be the raw bytes received (not re-serialized
 * JSON); `secret` the consumer's `whsec_…` secret, or several (old and new while rotating).
 */
export function verify(
  headers: WebhookHeaders,
  body: string | Uint8Array,
  secret: string | readonly string[],
  options: VerifyOptions = {},
): VerifiedWebhook {
  const id = header(headers, "webhook-id");
  const timestampText = header(headers, "webhook-timestamp");
  const signatures = header(headers, "webhook-signature");
  const keys = (typeof secret === "string" ? [secret] : secret).map(decodeSecret);
  const timestamp = checkTimestamp(timestampText, options);
  const signed = Buffer.concat([Buffer.from(`${id}.${timestampText}.`), Buffer.from(body)]);
  const offered = signatures.split(" ").flatMap(v1Signature);
  for (const key of keys) {
    const expected = createHmac("sha256", key).update(signed).digest();
    // Every offered entry is compared, in constant time, so timing tells nothing about which
    // entry or how much of one matched.
    const matches = offered.filter(
      (one) => one.length === expected.length && timingSafeEqual(one, expected),
    );
    if (matches.length > 0) return { id, timestamp };
  }
  throw new WebhookVerificationError(
    "no-matching-signature",
    "No webhook-signature entry matches the body with this secret: the body, ID or timestamp " +
      "was changed, or another secret signed it.",
  );
}

function header(headers: WebhookHeaders, name: string): string {
  const raw =
    headers instanceof Headers ? headers.get(name) : (headers[name] ?? headers[name.toLowerCase()]);
  const value = Array.isArray(raw) ? raw[0] : raw;
  if (typeof value !== "string" || value.trim() === "") {
    throw new WebhookVerificationError("missing-header", `The request has no ${name} header.`);
  }
  return value.trim();
}

function checkTimestamp(text: string, options: VerifyOptions): Date {
  if (!/^\d{1,12}$/.test(text)) {
    throw new WebhookVerificationError(
      "invalid-timestamp",
      "webhook-timestamp is not a whole number of seconds since 1970.",
    );
  }
  const seconds = Number(text);
  const now = (options.now ?? new Date()).getTime() / 1000;
  const tolerance = options.toleranceSeconds ?? DEFAULT_TOLERANCE_SECONDS;
  if (seconds < now - tolerance) {
    throw new WebhookVerificationError(
      "timestamp-too-old",
      `webhook-timestamp is more than ${tolerance} s in the past: a late or replayed delivery.`,
    );
  }
  if (seconds > now + tolerance) {
    throw new WebhookVerificationError(
      "timestamp-too-new",
      `webhook-timestamp is more than ${tolerance} s in the future: check the receiver's clock.`,
    );
  }
  return new Date(seconds * 1000);
}

/** The HMAC key in a `whsec_…` secret. The message never holds the secret. */
function decodeSecret(secret: string): Buffer {
  const encoded = secret.startsWith(SECRET_PREFIX) ? secret.slice(SECRET_PREFIX.length) : "";
  // Buffer.from skips characters that are not base64; a strict check keeps a mangled secret
  // from quietly becoming another key.
  if (encoded === "" || !/^[A-Za-z0-9+/]+={0,2}$/.test(encoded) || encoded.length % 4 !== 0) {
    throw new WebhookVerificationError(
      "invalid-secret",
      `The secret must be ${SECRET_PREFIX} followed by standard base64, ` +
        "as the broker's secret endpoint gives it.",
    );
  }
  return Buffer.from(encoded, "base64");
}

/** The signature bytes of a `v1,<base64>` entry; other versions are not ours to check. */
function v1Signature(entry: string): Buffer[] {
  const [version, encoded] = entry.split(",", 2);
  if (version !== "v1" || encoded === undefined || encoded === "") return [];
  return [Buffer.from(encoded, "base64")];
}
