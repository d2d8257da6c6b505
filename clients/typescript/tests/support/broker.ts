/**
 * The live broker the tests run against, from WEBHOOK_BROKER_URL and WEBHOOK_BROKER_TOKEN (an
 * admin token), as `clients/live_broker.py -- npm test` sets them. Each test makes its own
 * channel, producer and consumers under fresh random IDs, so tests never see each other's data.
 */
import { randomBytes } from "node:crypto";

import { Admin, Producer } from "../../src/index.js";

function required(name: string): string {
  const value = process.env[name];
  if (!value) {
    throw new Error(
      `${name} is not set: the tests need a live broker. Run them with ` +
        "`python clients/live_broker.py -- npm --prefix clients/typescript test` from the repository's root.",
    );
  }
  return value;
}

export const brokerUrl = required("WEBHOOK_BROKER_URL");
export const adminToken = required("WEBHOOK_BROKER_TOKEN");

export const admin = new Admin({ baseUrl: brokerUrl, token: adminToken });

/** A fresh ID for a resource of this test run: letters, digits and '-'. */
export function freshId(prefix: string): string {
  return `${prefix}-${randomBytes(6).toString("hex")}`;
}

export interface TestChannel {
  channelId: string;
  channelToken: string;
  producerId: string;
  producerToken: string;
  /** A producer for the channel, talking to `baseUrl` (the broker unless a test says). */
  producer(baseUrl?: string, retry?: { tries?: number; initialDelayMs?: number }): Producer;
}

/** A new channel and a new producer with known tokens. */
export async function newChannel(): Promise<TestChannel> {
  const channelId = freshId("ch");
  const producerId = freshId("pr");
  const channelToken = randomBytes(16).toString("hex");
  const producerToken = randomBytes(16).toString("hex");
  await admin.putChannel(channelId, { token: channelToken });
  await admin.putProducer(producerId, { token: producerToken });
  return {
    channelId,
    channelToken,
    producerId,
    producerToken,
    producer: (baseUrl = brokerUrl, retry = {}) =>
      new Producer({ baseUrl, channelId, channelToken, producerId, producerToken, retry }),
  };
}

/** Polls `probe` until it returns something other than undefined (generous: 60 s). */
export async function eventually<T>(probe: () => Promise<T | undefined>, what: string): Promise<T> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`gave up waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/** Every item of an async iterator, in order. */
export async function collect<T>(items: AsyncIterable<T>): Promise<T[]> {
  const all: T[] = [];
  for await (const item of items) all.push(item);
  return all;
}
