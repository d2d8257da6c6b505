import assert from "node:assert/strict";
import { test } from "node:test";

import { parseRetryAfter } from "../src/http.js";

test("Retry-After as seconds or as an HTTP date; anything else is no Retry-After", () => {
  assert.equal(parseRetryAfter("5"), 5000);
  assert.equal(parseRetryAfter(" 0 "), 0);
  const inAMinute = new Date(Date.now() + 60_000).toUTCString();
  const delay = parseRetryAfter(inAMinute);
  assert.ok(delay !== null && delay > 0 && delay <= 60_000, `delay ${delay}`);
  assert.equal(parseRetryAfter("Thu, 01 Jan 1970 00:00:00 GMT"), 0);
  assert.equal(parseRetryAfter("soon"), null);
  assert.equal(parseRetryAfter(null), null);
});
