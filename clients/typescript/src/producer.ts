/**
 * Publishing to one channel as one producer (docs/api.md, "Broadcast" and "Batch broadcast").
 *
 * Every message gets its ID before the first try (the caller's, or a fresh random one), so a
 * publish can be retried safely: when an answer is lost, the next try finds the message stored
 * and the broker's 409 for that ID means "already published", which is a success.
 */
import { randomUUID } from "node:crypto";

import { Conflict } from "./errors.js";
import { type ClientOptions, HttpClient, path } from "./http.js";
import type { BatchItem, BatchStored } from "./types.js";

/** Text is sent as is, bytes as they are, anything else as JSON. */
export type Payload = string | Uint8Array | ArrayBuffer | Record<string, unknown> | unknown[];

export interface PublishOptions {
  /** The message's ID, unique within the channel; a random one is made when absent. */
  messageId?: string;
  /** Default: text/plain; charset=utf-8 for text, application/octet-stream for bytes,
   * application/json for anything sent as JSON. */
  contentType?: string;
  /** Only the consumers subscribed to it get a job. */
  eventType?: string;
  /** Ordered consumers get one key's messages one at a time, in order. */
  orderingKey?: string;
  /** A 32-bit integer, higher first; default 0. */
  priority?: number;
  /** Release the message at this time instead of now (at least the broker's minimum delay). */
  scheduledFor?: Date | string;
  /** Metadata headers the broker keeps and sends with every delivery. */
  headers?: Record<string, string>;
}

export interface BatchMessage extends PublishOptions {
  payload: Payload;
}

export interface ProducerOptions extends ClientOptions {
  baseUrl: string;
  channelId: string;
  channelToken: string;
  producerId: string;
  producerToken: string;
}

export class Producer {
  readonly channelId: string;
  private readonly http: HttpClient;

  constructor(options: ProducerOptions) {
    this.channelId = options.channelId;
    this.http = new HttpClient(
      options.baseUrl,
      {
        "X-Broker-Channel-Token": options.channelToken,
        "X-Broker-Producer-ID": options.producerId,
        "X-Broker-Producer-Token": options.producerToken,
      },
      options,
    );
  }

  /** Publishes one message and returns its ID. */
  async publish(payload: Payload, options: PublishOptions = {}): Promise<string> {
    const messageId = options.messageId ?? newMessageId();
    const { body, contentType } = encodePayload(payload);
    try {
      await this.http.send({
        method: "POST",
        path: path`/channel/${this.channelId}/broadcast`,
        headers: broadcastHeaders(messageId, options, contentType),
        body,
        retry: true,
      });
    } catch (error) {
      // The broker has a message with this ID: an earlier try got through, or the caller
      // published it before. Either way it is published, once.
      if (!(error instanceof Conflict)) throw error;
    }
    return messageId;
  }

  /**
   * Publishes many messages in one request, all or none, and returns their IDs in order.
   * IDs must be unique within the batch (a RangeError otherwise, before anything is sent).
   */
  async publishBatch(messages: readonly BatchMessage[]): Promise<string[]> {
    const items = messages.map(batchItem);
    const ids = items.map((item) => item.id as string);
    if (new Set(ids).size !== ids.length) {
      throw new RangeError("publishBatch: a message ID is given twice in the batch");
    }
    try {
      await this.http.send({
        method: "POST",
        path: path`/channel/${this.channelId}/broadcast-batch`,
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ messages: items }),
        retry: true,
      });
    } catch (error) {
      if (!(error instanceof Conflict && allDuplicates(error.body, ids))) throw error;
    }
    return ids;
  }
}

/** A fresh message ID: a random UUID, which the broker's ID rule accepts. */
export function newMessageId(): string {
  return randomUUID();
}

function broadcastHeaders(
  messageId: string,
  options: PublishOptions,
  contentType: string,
): Record<string, string> {
  const headers: Record<string, string> = {
    ...options.headers,
    "X-Broker-Message-ID": messageId,
    "Content-Type": options.contentType ?? contentType,
  };
  const metadata = Object.keys(options.headers ?? {});
  if (metadata.length > 0) headers["X-Broker-Metadata-Headers"] = metadata.join(",");
  if (options.eventType !== undefined) headers["X-Broker-Event-Type"] = options.eventType;
  if (options.orderingKey !== undefined) headers["X-Broker-Ordering-Key"] = options.orderingKey;
  if (options.priority !== undefined) {
    headers["X-Broker-Message-Priority"] = String(options.priority);
  }
  if (options.scheduledFor !== undefined) {
    headers["X-Broker-Scheduled-For"] = rfc3339(options.scheduledFor);
  }
  return headers;
}

function batchItem(message: BatchMessage): BatchItem {
  const { body, contentType } = encodePayload(message.payload);
  const item: BatchItem = {
    id: message.messageId ?? newMessageId(),
    content_type: message.contentType ?? contentType,
    priority: message.priority,
    headers: message.headers,
    ordering_key: message.orderingKey,
    event_type: message.eventType,
    scheduled_for: message.scheduledFor === undefined ? undefined : rfc3339(message.scheduledFor),
  };
  if (typeof body === "string") item.payload = body;
  else item.payload_base64 = Buffer.from(body).toString("base64");
  return item;
}

/** Whether a batch's 409 names every ID of the batch: then an earlier try stored it whole. */
function allDuplicates(body: unknown, ids: readonly string[]): boolean {
  const duplicates = (body as { duplicates?: unknown } | null)?.duplicates;
  if (!Array.isArray(duplicates)) return false;
  const known = new Set(duplicates);
  return ids.every((id) => known.has(id));
}

function encodePayload(payload: Payload): { body: string | Uint8Array; contentType: string } {
  if (typeof payload === "string") {
    return { body: payload, contentType: "text/plain; charset=utf-8" };
  }
  if (payload instanceof Uint8Array)
    return { body: payload, contentType: "application/octet-stream" };
  if (payload instanceof ArrayBuffer) {
    return { body: new Uint8Array(payload), contentType: "application/octet-stream" };
  }
  return { body: JSON.stringify(payload), contentType: "application/json" };
}

function rfc3339(when: Date | string): string {
  return when instanceof Date ? when.toISOString() : when;
}
