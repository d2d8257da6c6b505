/**
 * Names for the generated types (src/schema.d.ts, made by `npm run generate` from the broker's
 * OpenAPI schema) that the hand-written layer uses. When the schema renames a component, this is
 * the one file to change.
 */
import type { components, paths } from "./schema.js";

type Schemas = components["schemas"];

/**
 * The JSON body of an answer, by the endpoint's path and method as the broker serves them (more
 * stable than operation IDs and component names, which the schema may rename).
 */
export type JsonAnswer<
  Path extends keyof paths,
  Method extends "get" | "put" | "post" | "delete",
  Status extends number,
> = paths[Path][Method] extends { responses: infer Responses }
  ? Status extends keyof Responses
    ? Responses[Status] extends { content: { "application/json": infer Body } }
      ? Body
      : never
    : never
  : never;

export type Channel = Schemas["Channel"];
export type Producer = Schemas["Producer"];
export type Consumer = Schemas["Consumer"];
export type Message = Schemas["Message"];
export type ScheduledMessage = Schemas["ScheduledMessage"];
export type MessagesStatus = Schemas["MessagesStatus"];
export type EventType = Schemas["EventType"];
export type SigningSecret = Schemas["SigningSecret"];
export type DeadJob = Schemas["JobLinks"];
export type DeadLetterAction = Schemas["DeadLetterAction"];
export type Pages = Schemas["Pages"];
export type BrokerStatus = Schemas["Status"];
export type DlqStatus = Schemas["DlqStatus"];
export type JobStatus = JsonAnswer<"/job-status", "get", 200>;
export type Requeued = Schemas["Requeued"];
export type Replay = Schemas["Replay"];
export type BatchItem = Schemas["BatchItemRequest"];
export type BatchStored = Schemas["BatchStored"];
/** A purge's answer: `deletedCount`, and `action` when it goes on in the background. */
export type Purged = Schemas["Deleted"] & { action?: DeadLetterAction };

/** The form fields of `PUT /producer/{p}` (a producer's `channels` as a list). */
export interface ProducerFields {
  name?: string;
  token?: string;
  channels?: readonly string[];
}

/** The form fields of `PUT /channel/{c}`. */
export interface ChannelFields {
  name?: string;
  token?: string;
}

/**
 * The form fields of `PUT /channel/{c}/consumer/{k}` (docs/api.md, "Management writes"), lists
 * as arrays and numbers as numbers; `null` sends a blank field (back to the default).
 */
export interface ConsumerFields {
  callbackUrl: string;
  name?: string;
  token?: string;
  type?: "push" | "pull";
  ordering?: "none" | "ordered";
  retryDelays?: readonly number[] | null;
  nonRetryableStatuses?: readonly number[] | null;
  maxInFlight?: number | null;
  maxJobAge?: number | null;
  maxPerSecond?: number | null;
  eventTypes?: readonly string[] | null;
  signingSecret?: string;
}

/** The form fields of `PUT /channel/{c}/event-type/{type}`; `schema` as an object or JSON text. */
export interface EventTypeFields {
  description?: string;
  schema?: object | string | null;
}
