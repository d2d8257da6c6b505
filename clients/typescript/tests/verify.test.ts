import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, describe, test } from "node:test";

import { verify, WebhookVerificationError } from "../src/index.js";
import { admin, eventually, freshId, newChannel, type TestChannel } from "./support/broker.js";
import { type Delivery, type Receiver, receiver } from "./support/servers.js";

/** A webhook delivered by the broker's dispatcher to a push consumer on 127.0.0.1. */
describe("verify, against deliveries the broker signed", () => {
  let hooks: Receiver;
  let channel: TestChannel;
  let consumerId: string;
  let secret: string;
  let delivery: Delivery;

  async function delivered(payload: string): Promise<Delivery> {
    const id = await channel.producer().publish(payload, { contentType: "application/json" });
    return eventually(
      async () => hooks.deliveries.find((one) => one.headers["webhook-id"] === id),
      `the delivery of ${id}`,
    );
  }

  function rejection(run: () => unknown): WebhookVerificationError {
    try {
      run();
    } catch (error) {
      assert.ok(
        error instanceof WebhookVerificationError,
        `not a WebhookVerificationError: ${String(error)}`,
      );
      return error;
    }
    assert.fail("verify accepted it");
  }

  before(async () => {
    hooks = await receiver();
    channel = await newChannel();
    consumerId = freshId("push");
    await admin.putConsumer(channel.channelId, consumerId, {
      callbackUrl: hooks.url,
      type: "push",
    });
    secret = (await admin.getSigningSecret(channel.channelId, consumerId)).SigningSecret;
    delivery = await delivered('{"hello":"world"}');
  });

  after(async () => {
    await hooks.close();
  });

  test("a genuine delivery verifies, from Node's headers or a fetch Headers", () => {
    const verified = verify(delivery.headers, delivery.body, secret);
    assert.equal(verified.id, delivery.headers["webhook-id"]);
    assert.equal(
      verified.timestamp.getTime(),
      Number(delivery.headers["webhook-timestamp"]) * 1000,
    );
    const headers = new Headers();
    for (const [name, value] of Object.entries(delivery.headers)) {
      if (typeof value === "string") headers.set(name, value);
    }
    assert.equal(verify(headers, delivery.body.toString("utf8"), secret).id, verified.id);
  });

  test("a changed body is refused", () => {
    const tampered = Buffer.from(delivery.body.toString("utf8").replace("world", "w0rld"));
    assert.equal(
      rejection(() => verify(delivery.headers, tampered, secret)).reason,
      "no-matching-signature",
    );
  });

  test("a changed ID or timestamp is refused", () => {
    const otherId = { ...delivery.headers, "webhook-id": "someone-else" };
    assert.equal(
      rejection(() => verify(otherId, delivery.body, secret)).reason,
      "no-matching-signature",
    );
    const moved = {
      ...delivery.headers,
      "webhook-timestamp": String(Number(delivery.headers["webhook-timestamp"]) - 1),
    };
    assert.equal(
      rejection(() => verify(moved, delivery.body, secret)).reason,
      "no-matching-signature",
    );
  });

  test("another secret is refused", () => {
    const wrong = `whsec_${randomBytes(32).toString("base64")}`;
    assert.equal(
      rejection(() => verify(delivery.headers, delivery.body, wrong)).reason,
      "no-matching-signature",
    );
  });

  test("an old delivery is refused after the tolerance, accepted within it", () => {
    const sentAt = Number(delivery.headers["webhook-timestamp"]) * 1000;
    const later = new Date(sentAt + 10 * 60_000);
    const old = rejection(() => verify(delivery.headers, delivery.body, secret, { now: later }));
    assert.equal(old.reason, "timestamp-too-old");
    assert.match(old.message, /300 s in the past/);
    assert.ok(
      verify(delivery.headers, delivery.body, secret, { now: later, toleranceSeconds: 900 }),
    );
    const earlier = new Date(sentAt - 10 * 60_000);
    assert.equal(
      rejection(() => verify(delivery.headers, delivery.body, secret, { now: earlier })).reason,
      "timestamp-too-new",
    );
  });

  test("missing headers and malformed secrets are named", () => {
    const { "webhook-signature": _signature, ...unsigned } = delivery.headers;
    const missing = rejection(() => verify(unsigned, delivery.body, secret));
    assert.equal(missing.reason, "missing-header");
    assert.match(missing.message, /webhook-signature/);
    const badTimestamp = { ...delivery.headers, "webhook-timestamp": "soon" };
    assert.equal(
      rejection(() => verify(badTimestamp, delivery.body, secret)).reason,
      "invalid-timestamp",
    );
    // Not 1 to 12 digits (the Python client's bound too): refused before any arithmetic.
    for (const timestamp of ["99999999999999999", "-1", "+1700000000", "1e9", "1_700_000_000"]) {
      const forged = { ...delivery.headers, "webhook-timestamp": timestamp };
      assert.equal(
        rejection(() => verify(forged, delivery.body, secret)).reason,
        "invalid-timestamp",
      );
    }
    const farFuture = { ...delivery.headers, "webhook-timestamp": "999999999999" };
    assert.equal(
      rejection(() => verify(farFuture, delivery.body, secret)).reason,
      "timestamp-too-new",
    );
    const malformed = rejection(() => verify(delivery.headers, delivery.body, "not-a-secret"));
    assert.equal(malformed.reason, "invalid-secret");
    assert.doesNotMatch(malformed.message, /not-a-secret/);
  });

  test("during a rotation both the old and the new secret verify", async () => {
    const rotated = (await admin.rotateSigningSecret(channel.channelId, consumerId)).SigningSecret;
    const next = await delivered('{"after":"rotation"}');
    assert.equal(String(next.headers["webhook-signature"]).split(" ").length, 2);
    assert.ok(verify(next.headers, next.body, secret));
    assert.ok(verify(next.headers, next.body, rotated));
    assert.ok(
      verify(next.headers, next.body, [`whsec_${randomBytes(32).toString("base64")}`, rotated]),
    );
  });
});
