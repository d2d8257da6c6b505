import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { describe, test } from "node:test";

import { Admin, BadRequest, NotFound, PreconditionFailed, Unauthorized } from "../src/index.js";
import {
  admin,
  brokerUrl,
  collect,
  freshId,
  newChannel,
  type TestChannel,
} from "./support/broker.js";
import { claimAndReport, type PullConsumer } from "./support/pull.js";

async function newPullConsumer(channel: TestChannel): Promise<PullConsumer> {
  const consumerId = freshId("co");
  const consumerToken = randomBytes(16).toString("hex");
  await admin.putConsumer(channel.channelId, consumerId, {
    callbackUrl: "http://127.0.0.1:9/unused",
    type: "pull",
    token: consumerToken,
    retryDelays: [1],
  });
  return {
    channelId: channel.channelId,
    consumerId,
    channelToken: channel.channelToken,
    consumerToken,
  };
}

describe("channels and producers", () => {
  test("create, read, update and list", async () => {
    const channelId = freshId("ch");
    const created = await admin.putChannel(channelId, { name: "Orders" });
    assert.equal(created.ID, channelId);
    assert.ok(created.Token, "a generated token is shown on create");
    const renamed = await admin.putChannel(channelId, { name: "All orders" });
    assert.equal(renamed.Name, "All orders");
    assert.equal(renamed.Token, undefined, "the token is not shown again");
    assert.equal((await admin.getChannel(channelId)).Name, "All orders");
    assert.ok((await collect(admin.channels())).includes(channelId));

    const producerId = freshId("pr");
    await admin.putProducer(producerId, { name: "Shop", channels: [channelId] });
    const producer = await admin.getProducer(producerId);
    assert.equal(producer.Name, "Shop");
    assert.deepEqual(producer.Channels, [channelId]);
    assert.ok((await collect(admin.producers())).includes(producerId));
  });

  test("a write with a stale If-Unmodified-Since is refused", async () => {
    const channel = await newChannel();
    const error = await admin
      .putChannel(
        channel.channelId,
        { name: "late" },
        { ifUnmodifiedSince: new Date("2001-01-01T00:00:00Z") },
      )
      .catch((failure: unknown) => failure);
    assert.ok(error instanceof PreconditionFailed);
    assert.equal(error.status, 412);
  });

  test("errors carry the broker's status and message", async () => {
    const missing = await admin.getChannel(freshId("none")).catch((error: unknown) => error);
    assert.ok(missing instanceof NotFound);
    assert.equal(missing.status, 404);
    assert.ok(missing.message.length > 0);
    assert.deepEqual(missing.body, { Error: missing.message });

    const stranger = new Admin({ baseUrl: brokerUrl, token: "not-an-admin-token" });
    const refused = await stranger.getChannel("anything").catch((error: unknown) => error);
    assert.ok(refused instanceof Unauthorized);
    assert.ok(refused.status === 401 || refused.status === 403, `status ${refused.status}`);

    const channel = await newChannel();
    const invalid = await admin
      .putConsumer(channel.channelId, freshId("co"), {
        callbackUrl: "http://127.0.0.1:9/x",
        maxInFlight: 0,
      })
      .catch((error: unknown) => error);
    assert.ok(invalid instanceof BadRequest);
    assert.equal(invalid.status, 400);
    assert.match(invalid.message, /maxInFlight/);
  });
});

describe("consumers", () => {
  test("every field of a PUT reaches the consumer; pause, resume, circuit, secret, delete", async () => {
    const channel = await newChannel();
    const consumerId = freshId("co");
    const consumer = await admin.putConsumer(channel.channelId, consumerId, {
      callbackUrl: "http://127.0.0.1:9/hook",
      name: "ERP",
      type: "pull",
      ordering: "ordered",
      retryDelays: [5, 60],
      nonRetryableStatuses: [400, 422],
      maxInFlight: 7,
      maxJobAge: 3600,
      maxPerSecond: 2.5,
      eventTypes: ["order.*", "refund.created"],
    });
    assert.equal(consumer.Name, "ERP");
    assert.equal(consumer.Type, "pull");
    assert.equal(consumer.Ordering, "ordered");
    assert.deepEqual(consumer.RetryDelays, [5, 60]);
    assert.deepEqual(consumer.NonRetryableStatuses, [400, 422]);
    assert.equal(consumer.MaxInFlight, 7);
    assert.equal(consumer.MaxJobAge, 3600);
    assert.equal(consumer.MaxPerSecond, 2.5);
    assert.deepEqual(consumer.EventTypes, ["order.*", "refund.created"]);

    const cleared = await admin.putConsumer(channel.channelId, consumerId, {
      callbackUrl: "http://127.0.0.1:9/hook",
      maxInFlight: null,
    });
    assert.equal(cleared.MaxInFlight, null);
    assert.equal(cleared.Name, "ERP", "omitted fields keep their values");
    assert.deepEqual(await collect(admin.consumers(channel.channelId)), [consumerId]);

    assert.equal((await admin.pauseConsumer(channel.channelId, consumerId)).Paused, true);
    assert.equal((await admin.getConsumer(channel.channelId, consumerId)).Paused, true);
    assert.equal((await admin.resumeConsumer(channel.channelId, consumerId)).Paused, false);
    assert.equal((await admin.closeCircuit(channel.channelId, consumerId)).CircuitState, "closed");

    const secret = await admin.getSigningSecret(channel.channelId, consumerId);
    assert.match(secret.SigningSecret, /^whsec_/);
    const rotated = await admin.rotateSigningSecret(channel.channelId, consumerId);
    assert.notEqual(rotated.SigningSecret, secret.SigningSecret);
    assert.ok(rotated.PreviousSigningSecretExpiresAt);

    await admin.deleteConsumer(channel.channelId, consumerId);
    await assert.rejects(admin.getConsumer(channel.channelId, consumerId), NotFound);
  });
});

describe("messages", () => {
  test("lists follow Pages.next across pages", async () => {
    const channel = await newChannel();
    const messages = Array.from({ length: 60 }, (_, index) => ({ payload: `m${index}` }));
    const ids = await channel.producer().publishBatch(messages);
    const listed = await collect(admin.messages(channel.channelId));
    assert.equal(listed.length, 60, "three pages of 25, 25 and 10");
    assert.deepEqual(new Set(listed), new Set(ids));
    assert.equal(
      (await collect(admin.messages(channel.channelId, { status: ["ACKNOWLEDGED"] }))).length,
      60,
    );
    assert.deepEqual(
      await collect(admin.messages(channel.channelId, { status: ["DISPATCHED"] })),
      [],
    );
    const counts = await admin.messagesStatus(channel.channelId);
    assert.equal(counts.counts["ACKNOWLEDGED"]?.Count, 60);
  });

  test("a message with its jobs, and a replay once delivered", async () => {
    const channel = await newChannel();
    const consumer = await newPullConsumer(channel);
    const id = await channel.producer().publish("replay me");
    const [job] = (await admin.getMessage(channel.channelId, id)).Jobs;
    assert.equal(job?.Status, "QUEUED");
    await claimAndReport(consumer, 1, "DELIVERED");
    assert.equal((await admin.getMessage(channel.channelId, id)).Jobs[0]?.Status, "DELIVERED");
    const replay = await admin.replayMessage(channel.channelId, id, {
      consumer: consumer.consumerId,
    });
    assert.deepEqual(replay.Replayed, [consumer.consumerId]);
  });
});

describe("the dead-letter queue", () => {
  test("list, count, requeue and purge dead jobs", async () => {
    const channel = await newChannel();
    const consumer = await newPullConsumer(channel);
    const { channelId, consumerId } = consumer;
    await channel.producer().publishBatch([{ payload: "a" }, { payload: "b" }, { payload: "c" }]);
    const killed = await claimAndReport(consumer, 10, "DEAD");
    assert.equal(killed.length, 3);

    const dead = await collect(admin.deadJobs(channelId, consumerId));
    assert.deepEqual(new Set(dead.map((job) => job.ID)), new Set(killed));
    assert.ok(
      dead.every((job) => job.Status === "DEAD" && job.LastError.includes("refused by the test")),
    );
    const perConsumer = (await admin.dlqStatus()).consumers.find(
      (entry) => entry.consumerId === consumerId,
    );
    assert.equal(perConsumer?.deadCount, 3);
    const counts = (await admin.jobStatus())[channelId]?.[consumerId] ?? [];
    assert.equal(counts.find((entry) => entry.status === 1004)?.count, 3);

    assert.equal((await admin.requeueDeadJobs(channelId, consumerId)).requeuedCount, 3);
    assert.deepEqual(await collect(admin.deadJobs(channelId, consumerId)), []);

    assert.equal((await claimAndReport(consumer, 10, "DEAD")).length, 3);
    const purged = await admin.purgeDeadJobs(channelId, consumerId, consumer);
    assert.equal(purged.deletedCount, 3);
    assert.deepEqual(await collect(admin.deadJobs(channelId, consumerId)), []);

    assert.equal((await admin.requeueDeadJobs(channelId, consumerId)).requeuedCount, 0);
    await channel.producer().publish("one more");
    assert.equal((await claimAndReport(consumer, 10, "DEAD")).length, 1);
    assert.equal((await admin.purgeDeadJobs(channelId, consumerId)).deletedCount, 1); // as admin
  });

  test("a requeue with the consumer's token, and a wrong token refused", async () => {
    const channel = await newChannel();
    const consumer = await newPullConsumer(channel);
    await channel.producer().publish("x");
    await claimAndReport(consumer, 1, "DEAD");
    const wrong = await admin
      .requeueDeadJobs(channel.channelId, consumer.consumerId, { consumerToken: "wrong" })
      .catch((error: unknown) => error);
    assert.ok(wrong instanceof BadRequest);
    const requeued = await admin.requeueDeadJobs(channel.channelId, consumer.consumerId, {
      consumerToken: consumer.consumerToken,
      since: new Date(Date.now() - 3_600_000),
    });
    assert.equal(requeued.requeuedCount, 1);
  });
});

describe("the event type catalogue", () => {
  test("create, read, list, update, delete; its schema checks publishes", async () => {
    const channel = await newChannel();
    const schema = { type: "object", required: ["sku"], properties: { sku: { type: "string" } } };
    await admin.putEventType(channel.channelId, "order.created", {
      description: "An order came in",
      schema,
    });
    const entry = await admin.getEventType(channel.channelId, "order.created");
    assert.equal(entry.Description, "An order came in");
    assert.deepEqual(entry.Schema, schema);
    assert.deepEqual(await collect(admin.eventTypes(channel.channelId)), ["order.created"]);

    const producer = channel.producer();
    const refused = await producer
      .publish({ qty: 1 }, { eventType: "order.created" })
      .catch((error: unknown) => error);
    assert.ok(refused instanceof BadRequest);
    assert.match(refused.message, /sku/);
    await producer.publish({ sku: "A-1" }, { eventType: "order.created" });

    await admin.putEventType(channel.channelId, "order.created", { schema: null });
    assert.equal((await admin.getEventType(channel.channelId, "order.created")).Schema, null);
    await admin.deleteEventType(channel.channelId, "order.created");
    await assert.rejects(admin.getEventType(channel.channelId, "order.created"), NotFound);
  });

  test("the broker's status", async () => {
    const status = await admin.status();
    assert.equal(status.status, "ok");
    assert.equal(status.database.healthy, true);
  });
});
