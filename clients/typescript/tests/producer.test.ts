import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  BadRequest,
  BrokerUnavailable,
  Conflict,
  Producer,
  RateLimited,
  ServerError,
  Unauthorized,
} from "../src/index.js";
import { admin, brokerUrl, collect, newChannel } from "./support/broker.js";
import { failingProxy } from "./support/servers.js";

describe("Producer.publish", () => {
  test("every option reaches the message", async () => {
    const channel = await newChannel();
    const id = await channel.producer().publish(
      { order: 7 },
      {
        messageId: "order-7",
        eventType: "order.created",
        orderingKey: "customer-1",
        priority: -3,
        headers: { "X-Tenant": "acme", "X-Trace-Note": "first" },
      },
    );
    assert.equal(id, "order-7");
    const message = await admin.getMessage(channel.channelId, "order-7");
    assert.equal(message.Payload, '{"order":7}');
    assert.equal(message.ContentType, "application/json");
    assert.equal(message.EventType, "order.created");
    assert.equal(message.Priority, -3);
    assert.equal(message.ProducerID, channel.producerId);
    assert.deepEqual(message.Headers, { "X-Tenant": "acme", "X-Trace-Note": "first" });
    assert.equal(message.ScheduledFor, null);
  });

  test("a scheduled message keeps its schedule, ordering key and the rest", async () => {
    const channel = await newChannel();
    const scheduledFor = new Date(Date.now() + 3_600_000);
    scheduledFor.setMilliseconds(0);
    const id = await channel.producer().publish("later", {
      contentType: "text/x-note",
      eventType: "note.due",
      orderingKey: "notes",
      priority: 5,
      scheduledFor,
      headers: { "X-Tenant": "acme" },
    });
    const scheduled = await admin.getScheduledMessage(channel.channelId, id);
    assert.equal(scheduled.messageId, id);
    assert.equal(scheduled.payload, "later");
    assert.equal(scheduled.contentType, "text/x-note");
    assert.equal(scheduled.eventType, "note.due");
    assert.equal(scheduled.orderingKey, "notes");
    assert.equal(scheduled.priority, 5);
    assert.deepEqual(scheduled.headers, { "X-Tenant": "acme" });
    assert.equal(new Date(scheduled.dispatchSchedule).getTime(), scheduledFor.getTime());
    await admin.cancelScheduledMessage(channel.channelId, id);
  });

  test("makes a message ID when none is given, and sends bytes as bytes", async () => {
    const channel = await newChannel();
    const bytes = Uint8Array.from([0, 255, 1, 254]);
    const id = await channel.producer().publish(bytes);
    assert.match(id, /^[0-9a-f-]{36}$/);
    const message = await admin.getMessage(channel.channelId, id);
    assert.equal(message.ContentType, "application/octet-stream");
    assert.equal(message.PayloadEncoding, "base64");
    assert.deepEqual(Buffer.from(message.Payload ?? "", "base64"), Buffer.from(bytes));
  });

  test("a 409 for an ID the broker already has counts as published", async () => {
    const channel = await newChannel();
    const producer = channel.producer();
    await producer.publish("once", { messageId: "dup-1" });
    assert.equal(await producer.publish("once", { messageId: "dup-1" }), "dup-1");
    assert.deepEqual(await collect(admin.messages(channel.channelId)), ["dup-1"]);
  });

  test("refusals carry the broker's status and message", async () => {
    const channel = await newChannel();
    const wrongToken = new Producer({
      baseUrl: brokerUrl,
      channelId: channel.channelId,
      channelToken: "not-the-token",
      producerId: channel.producerId,
      producerToken: channel.producerToken,
    });
    const refused = await wrongToken.publish("x").catch((error: unknown) => error);
    assert.ok(refused instanceof Unauthorized);
    assert.equal(refused.status, 403);
    assert.match(refused.message, /token/i);
    assert.match(String(refused), /^HTTP 403: /);

    const bad = await channel
      .producer()
      .publish("x", { eventType: "no spaces" })
      .catch((error: unknown) => error);
    assert.ok(bad instanceof BadRequest);
    assert.equal(bad.status, 400);
    assert.match(bad.message, /event type/i);
  });
});

describe("Producer.publishBatch", () => {
  test("publishes every message with its options, IDs in order", async () => {
    const channel = await newChannel();
    const ids = await channel.producer().publishBatch([
      { payload: "text one", messageId: "b-1", priority: 2, eventType: "a.b" },
      { payload: { n: 2 }, headers: { "X-Tenant": "t2" }, orderingKey: "k" },
      { payload: Uint8Array.from([0xff, 0x00, 0x80]), contentType: "application/x-bin" },
    ]);
    assert.equal(ids.length, 3);
    assert.equal(ids[0], "b-1");
    const [first, second, third] = await Promise.all(
      ids.map((id) => admin.getMessage(channel.channelId, id)),
    );
    assert.equal(first?.Payload, "text one");
    assert.equal(first?.Priority, 2);
    assert.equal(first?.EventType, "a.b");
    assert.equal(second?.Payload, '{"n":2}');
    assert.equal(second?.ContentType, "application/json");
    assert.deepEqual(second?.Headers, { "X-Tenant": "t2" });
    assert.equal(third?.ContentType, "application/x-bin");
    assert.deepEqual(Buffer.from(third?.Payload ?? "", "base64"), Buffer.from([0xff, 0x00, 0x80]));
  });

  test("a batch the broker already has counts as published; a partial overlap is a Conflict", async () => {
    const channel = await newChannel();
    const producer = channel.producer();
    const batch = [
      { payload: "a", messageId: "x-1" },
      { payload: "b", messageId: "x-2" },
    ];
    await producer.publishBatch(batch);
    assert.deepEqual(await producer.publishBatch(batch), ["x-1", "x-2"]);
    const overlap = await producer
      .publishBatch([
        { payload: "a", messageId: "x-1" },
        { payload: "c", messageId: "x-3" },
      ])
      .catch((error: unknown) => error);
    assert.ok(overlap instanceof Conflict);
    assert.deepEqual((overlap.body as { duplicates: string[] }).duplicates, ["x-1"]);
  });

  test("an ID given twice is refused before anything is sent", async () => {
    const channel = await newChannel();
    await assert.rejects(
      channel.producer().publishBatch([
        { payload: "a", messageId: "same" },
        { payload: "b", messageId: "same" },
      ]),
      RangeError,
    );
  });
});

describe("retries", () => {
  test("5xx answers are retried with the same message ID until the broker takes it", async () => {
    const channel = await newChannel();
    const proxy = await failingProxy(brokerUrl, { count: 3, how: "status", status: 503 });
    try {
      const id = await channel.producer(proxy.url, { initialDelayMs: 10 }).publish("retried");
      assert.equal(proxy.requests, 4);
      assert.deepEqual(await collect(admin.messages(channel.channelId)), [id]);
    } finally {
      await proxy.close();
    }
  });

  test("dropped connections are retried", async () => {
    const channel = await newChannel();
    const proxy = await failingProxy(brokerUrl, { count: 2, how: "drop" });
    try {
      const ids = await channel
        .producer(proxy.url, { initialDelayMs: 10 })
        .publishBatch([{ payload: "a" }, { payload: "b" }]);
      assert.equal(proxy.requests, 3);
      assert.deepEqual(new Set(await collect(admin.messages(channel.channelId))), new Set(ids));
    } finally {
      await proxy.close();
    }
  });

  test("a lost answer is retried and the broker's 409 makes it a success, stored once", async () => {
    const channel = await newChannel();
    const proxy = await failingProxy(brokerUrl, { count: 1, how: "forward-then-503" });
    try {
      const producer = channel.producer(proxy.url, { initialDelayMs: 10 });
      const id = await producer.publish("exactly once");
      assert.equal(proxy.requests, 2);
      assert.deepEqual(await collect(admin.messages(channel.channelId)), [id]);

      proxy.requests = 0;
      const ids = await producer.publishBatch([{ payload: "one" }, { payload: "two" }]);
      assert.equal(proxy.requests, 2);
      assert.equal((await collect(admin.messages(channel.channelId))).length, 3);
      assert.ok(ids.every((one) => one !== id));
    } finally {
      await proxy.close();
    }
  });

  test("a 429's Retry-After is waited for", async () => {
    const channel = await newChannel();
    const proxy = await failingProxy(brokerUrl, {
      count: 1,
      how: "status",
      status: 429,
      retryAfter: "1",
    });
    try {
      const started = performance.now();
      await channel.producer(proxy.url, { initialDelayMs: 10 }).publish("after a wait");
      // 950, not 1000: a timer may fire a fraction of a millisecond early by performance.now().
      assert.ok(performance.now() - started >= 950, "the retry came before Retry-After");
      assert.equal(proxy.requests, 2);
    } finally {
      await proxy.close();
    }
  });

  test("a Retry-After longer than the policy allows is not waited for: the 429 is thrown", async () => {
    const channel = await newChannel();
    const proxy = await failingProxy(brokerUrl, {
      count: 1,
      how: "status",
      status: 429,
      retryAfter: "3600",
    });
    try {
      const error = await channel
        .producer(proxy.url)
        .publish("x")
        .catch((failure: unknown) => failure);
      assert.ok(error instanceof RateLimited);
      assert.equal(error.status, 429);
      assert.equal(error.retryAfterMs, 3_600_000);
      assert.equal(proxy.requests, 1);
    } finally {
      await proxy.close();
    }
  });

  test("retries are bounded: the last failure is thrown with its status and message", async () => {
    const channel = await newChannel();
    const proxy = await failingProxy(brokerUrl, { count: 100, how: "status", status: 502 });
    try {
      const error = await channel
        .producer(proxy.url, { tries: 3, initialDelayMs: 10 })
        .publish("never")
        .catch((failure: unknown) => failure);
      assert.ok(error instanceof ServerError);
      assert.equal(error.status, 502);
      assert.equal(error.message, "the proxy fails this one on purpose");
      assert.equal(proxy.requests, 3);
    } finally {
      await proxy.close();
    }
  });

  test("no broker at all is a BrokerUnavailable with no status", async () => {
    const proxy = await failingProxy(brokerUrl, { count: 0, how: "drop" });
    const deadUrl = proxy.url;
    await proxy.close();
    const channel = await newChannel();
    const error = await channel
      .producer(deadUrl, { tries: 2, initialDelayMs: 10 })
      .publish("nowhere")
      .catch((failure: unknown) => failure);
    assert.ok(error instanceof BrokerUnavailable);
    assert.equal(error.status, null);
    assert.match(String(error), /^Broker unreachable: /);
  });

  test("a 4xx other than 429 is not retried", async () => {
    const channel = await newChannel();
    const proxy = await failingProxy(brokerUrl, { count: 0, how: "status" });
    try {
      const error = await channel
        .producer(proxy.url, { initialDelayMs: 10 })
        .publish("x", { priority: 2 ** 40 })
        .catch((failure: unknown) => failure);
      assert.ok(error instanceof BadRequest);
      assert.equal(proxy.requests, 1);
    } finally {
      await proxy.close();
    }
  });
});
