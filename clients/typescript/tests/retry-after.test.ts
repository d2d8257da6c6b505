import assert from "node:assert/strict";
import { test } from "node:test";

import { Admin, Producer, ServerError } from "../src/index.js";
import { HttpClient, parseRetryAfter } from "../src/http.js";
import { admin, adminToken, brokerUrl, freshId, newChannel } from "./support/broker.js";
import { failingProxy } from "./support/servers.js";

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

const TWENTY_SECONDS = { timeout: 20_000 };

test("a 503's Retry-After is waited instead of the backoff", TWENTY_SECONDS, async () => {
  const channel = await newChannel();
  const proxy = await failingProxy(brokerUrl, {
    count: 2,
    how: "status",
    status: 503,
    retryAfter: "0",
  });
  try {
    // A backoff longer than the test's timeout: only Retry-After: 0 lets it end in time.
    const producer = new Producer({
      ...channel,
      baseUrl: proxy.url,
      retry: { initialDelayMs: 30_000, maxDelayMs: 30_000 },
    });
    await producer.publish("after two 503s");
    assert.equal(proxy.requests, 3);
  } finally {
    await proxy.close();
  }
});

test("a 503's Retry-After past the cap is not waited for: the ServerError is thrown", async () => {
  const channel = await newChannel();
  const proxy = await failingProxy(brokerUrl, {
    count: 1,
    how: "status",
    status: 503,
    retryAfter: "3600",
  });
  try {
    const error = await channel
      .producer(proxy.url)
      .publish("x")
      .catch((failure: unknown) => failure);
    assert.ok(error instanceof ServerError);
    assert.equal(error.retryAfterMs, 3_600_000);
    assert.equal(proxy.requests, 1);
  } finally {
    await proxy.close();
  }
});

test("an admin PUT is retried after a 503, as a GET is (Python's rule too)", async () => {
  const channelId = freshId("ch");
  const made = await admin.putChannel(channelId, { name: "before" });
  const proxy = await failingProxy(brokerUrl, { count: 1, how: "status", status: 503 });
  try {
    const throughProxy = new Admin({
      baseUrl: proxy.url,
      token: adminToken,
      retry: { initialDelayMs: 10 },
    });
    // Given If-Unmodified-Since, the PUT is the only request: the 503 is its first try's.
    const since = new Date(made.ChangedAt);
    await throughProxy.putChannel(channelId, { name: "after" }, { ifUnmodifiedSince: since });
    assert.equal(proxy.requests, 2);
    assert.equal((await admin.getChannel(channelId)).Name, "after");
  } finally {
    await proxy.close();
  }
});

test("a Pages link resolves against the base URL's origin: a path prefix is not doubled", () => {
  const http = new HttpClient("http://127.0.0.1:8000/broker/", {});
  assert.equal(
    http.resolveLink("/broker/channels?next=abc"),
    "http://127.0.0.1:8000/broker/channels?next=abc",
  );
});
