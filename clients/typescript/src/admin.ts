/**
 * The admin API (docs/api.md): channels, producers, consumers, messages, the dead-letter queue,
 * the event type catalogue and the broker's counts, with an admin token. Reads are retried as a
 * publish is (they are safe to repeat); writes are sent once, and a failure is the caller's to
 * judge.
 */
import { NotFound } from "./errors.js";
import { type ClientOptions, HttpClient, path } from "./http.js";
import { eachItem, lastSegment, resultUrls } from "./pages.js";
import type {
  BrokerStatus,
  Channel,
  ChannelFields,
  Consumer,
  ConsumerFields,
  DeadJob,
  DeadLetterAction,
  DlqStatus,
  EventType,
  EventTypeFields,
  JobStatus,
  Message,
  MessagesStatus,
  Pages,
  Producer,
  ProducerFields,
  Purged,
  Replay,
  Requeued,
  ScheduledMessage,
  SigningSecret,
} from "./types.js";

export interface AdminOptions extends ClientOptions {
  baseUrl: string;
  /** A token of BROKER_ADMIN_TOKENS, or an API key made by `manage.py create_api_key`. */
  token: string;
}

/**
 * Updates need the resource's Last-Modified in If-Unmodified-Since (docs/api.md, "Management
 * writes"). Give the one from your own read to be refused (412) if someone changed the resource
 * since; without it the client reads the resource just before writing, so the write wins.
 */
export interface WriteOptions {
  ifUnmodifiedSince?: string | Date;
}

/** The tokens of a consumer, which a few endpoints take instead of (or as well as) admin. */
export interface ConsumerTokens {
  channelToken: string;
  consumerToken: string;
}

type Form = Record<string, string | number | readonly (string | number)[] | null | undefined>;

export class Admin {
  private readonly http: HttpClient;

  constructor(options: AdminOptions) {
    this.http = new HttpClient(
      options.baseUrl,
      { Authorization: `Bearer ${options.token}` },
      options,
    );
  }

  // The broker as a whole.

  async status(): Promise<BrokerStatus> {
    return (await this.get("/_status")) as BrokerStatus;
  }

  /** Job counts per channel, consumer and status. */
  async jobStatus(): Promise<JobStatus> {
    return (await this.get("/job-status")) as JobStatus;
  }

  /** Dead jobs per consumer, for consumers that have any. */
  async dlqStatus(): Promise<DlqStatus> {
    return (await this.get("/dlq-status")) as DlqStatus;
  }

  // Producers and channels.

  /** Every producer's ID, newest first. */
  producers(): AsyncGenerator<string> {
    return this.ids("/producers");
  }

  async getProducer(producerId: string): Promise<Producer> {
    return (await this.get(path`/producer/${producerId}`)) as Producer;
  }

  /** Creates or updates a producer; `Token` is in the answer only when this call set it. */
  async putProducer(
    producerId: string,
    fields: ProducerFields,
    options?: WriteOptions,
  ): Promise<Producer> {
    return (await this.put(path`/producer/${producerId}`, { ...fields }, options)) as Producer;
  }

  /** Every channel's ID, newest first. */
  channels(): AsyncGenerator<string> {
    return this.ids("/channels");
  }

  async getChannel(channelId: string): Promise<Channel> {
    return (await this.get(path`/channel/${channelId}`)) as Channel;
  }

  /** Creates or updates a channel; `Token` is in the answer only when this call set it. */
  async putChannel(
    channelId: string,
    fields: ChannelFields,
    options?: WriteOptions,
  ): Promise<Channel> {
    return (await this.put(path`/channel/${channelId}`, { ...fields }, options)) as Channel;
  }

  // Consumers.

  /** The IDs of a channel's consumers, newest first. */
  consumers(channelId: string): AsyncGenerator<string> {
    return this.ids(path`/channel/${channelId}/consumers`);
  }

  async getConsumer(channelId: string, consumerId: string): Promise<Consumer> {
    return (await this.get(consumerPath(channelId, consumerId))) as Consumer;
  }

  /** Creates or updates a consumer, push or pull, with every field the API takes. */
  async putConsumer(
    channelId: string,
    consumerId: string,
    fields: ConsumerFields,
    options?: WriteOptions,
  ): Promise<Consumer> {
    return (await this.put(
      consumerPath(channelId, consumerId),
      { ...fields },
      options,
    )) as Consumer;
  }

  /** Deletes a consumer with its jobs (queued, in flight and dead). */
  async deleteConsumer(
    channelId: string,
    consumerId: string,
    options?: WriteOptions,
  ): Promise<void> {
    const resource = consumerPath(channelId, consumerId);
    const since = await this.precondition(resource, options);
    await this.http.send({ method: "DELETE", path: resource, headers: since });
  }

  /** Stops delivery (push) or hands out nothing (pull); jobs keep accumulating. */
  async pauseConsumer(channelId: string, consumerId: string): Promise<Consumer> {
    return (await this.post(consumerPath(channelId, consumerId) + "/pause")) as Consumer;
  }

  async resumeConsumer(channelId: string, consumerId: string): Promise<Consumer> {
    return (await this.post(consumerPath(channelId, consumerId) + "/resume")) as Consumer;
  }

  /** Closes an open circuit breaker now; delivery resumes with the next claim. */
  async closeCircuit(channelId: string, consumerId: string): Promise<Consumer> {
    return (await this.post(consumerPath(channelId, consumerId) + "/circuit/close")) as Consumer;
  }

  /** The secret that signs the consumer's deliveries (`whsec_…`), for `verify`. */
  async getSigningSecret(channelId: string, consumerId: string): Promise<SigningSecret> {
    return (await this.get(consumerPath(channelId, consumerId) + "/secret")) as SigningSecret;
  }

  /** A new signing secret; the old one keeps signing beside it for 24 hours. */
  async rotateSigningSecret(channelId: string, consumerId: string): Promise<SigningSecret> {
    return (await this.post(consumerPath(channelId, consumerId) + "/secret")) as SigningSecret;
  }

  // Messages.

  /** A message with its jobs, one per consumer. */
  async getMessage(channelId: string, messageId: string): Promise<Message> {
    return (await this.get(path`/channel/${channelId}/message/${messageId}`)) as Message;
  }

  /** The IDs of a channel's messages, newest first; `status` filters (names or numbers). */
  messages(
    channelId: string,
    options: { status?: readonly string[] } = {},
  ): AsyncGenerator<string> {
    return this.ids(path`/channel/${channelId}/messages`, { status: options.status });
  }

  async messagesStatus(channelId: string): Promise<MessagesStatus> {
    return (await this.get(path`/channel/${channelId}/messages-status`)) as MessagesStatus;
  }

  /** Delivers a delivered message again, to one consumer or to every one. */
  async replayMessage(
    channelId: string,
    messageId: string,
    options: { consumer?: string } = {},
  ): Promise<Replay> {
    const resource = path`/channel/${channelId}/message/${messageId}/replay`;
    return (await this.post(resource, { consumer: options.consumer })) as Replay;
  }

  async getScheduledMessage(channelId: string, messageId: string): Promise<ScheduledMessage> {
    return (await this.get(
      path`/channel/${channelId}/scheduled-message/${messageId}`,
    )) as ScheduledMessage;
  }

  /** Cancels a scheduled message not released yet. */
  async cancelScheduledMessage(channelId: string, messageId: string): Promise<void> {
    const resource = path`/channel/${channelId}/scheduled-message/${messageId}`;
    await this.http.send({ method: "DELETE", path: resource });
  }

  // The dead-letter queue.

  /** A consumer's dead jobs, most recently dead first. */
  deadJobs(channelId: string, consumerId: string): AsyncGenerator<DeadJob> {
    const read = (body: unknown) => {
      const page = body as { DeadJobs: DeadJob[]; Pages: Pages };
      return { items: page.DeadJobs, pages: page.Pages };
    };
    return eachItem(this.http, consumerPath(channelId, consumerId) + "/dlq", {}, read);
  }

  /**
   * Requeues the consumer's dead jobs (those dead since `since`, when given). A big queue goes on
   * in the background: then the answer has `action`, to follow with `dlqAction`.
   */
  async requeueDeadJobs(
    channelId: string,
    consumerId: string,
    options: { since?: Date | string; consumerToken?: string } = {},
  ): Promise<Requeued> {
    const since = options.since instanceof Date ? options.since.toISOString() : options.since;
    const form = { since, requeue: options.consumerToken };
    return (await this.post(consumerPath(channelId, consumerId) + "/dlq", form)) as Requeued;
  }

  /** Deletes the consumer's dead jobs, as the admin; or with the channel's and the consumer's
   * tokens when given (webhook-broker's way). */
  async purgeDeadJobs(
    channelId: string,
    consumerId: string,
    tokens?: ConsumerTokens,
  ): Promise<Purged> {
    const answer = await this.http.send({
      method: "DELETE",
      path: consumerPath(channelId, consumerId) + "/dlq",
      headers: tokens
        ? {
            "X-Broker-Channel-Token": tokens.channelToken,
            "X-Broker-Consumer-Token": tokens.consumerToken,
          }
        : {},
    });
    return answer.body as Purged;
  }

  /** How far a requeue or purge that went on in the background got. */
  async dlqAction(
    channelId: string,
    consumerId: string,
    actionId: string,
  ): Promise<DeadLetterAction> {
    const resource = consumerPath(channelId, consumerId) + path`/dlq/action/${actionId}`;
    return (await this.get(resource)) as DeadLetterAction;
  }

  // The event type catalogue.

  /** The names of a channel's catalogued event types, newest first. */
  eventTypes(channelId: string): AsyncGenerator<string> {
    return this.ids(path`/channel/${channelId}/event-types`);
  }

  async getEventType(channelId: string, name: string): Promise<EventType> {
    return (await this.get(path`/channel/${channelId}/event-type/${name}`)) as EventType;
  }

  /** Creates or updates a catalogue entry; `schema` is a JSON Schema payloads must match. */
  async putEventType(
    channelId: string,
    name: string,
    fields: EventTypeFields,
    options?: WriteOptions,
  ): Promise<EventType> {
    const { schema, description } = fields;
    const form = {
      description,
      schema: typeof schema === "object" && schema !== null ? JSON.stringify(schema) : schema,
    };
    return (await this.put(
      path`/channel/${channelId}/event-type/${name}`,
      form,
      options,
    )) as EventType;
  }

  async deleteEventType(channelId: string, name: string, options?: WriteOptions): Promise<void> {
    const resource = path`/channel/${channelId}/event-type/${name}`;
    const since = await this.precondition(resource, options);
    await this.http.send({ method: "DELETE", path: resource, headers: since });
  }

  // How requests are made.

  private async get(resource: string): Promise<unknown> {
    return (await this.http.send({ method: "GET", path: resource, retry: true })).body;
  }

  private async post(resource: string, form: Form = {}): Promise<unknown> {
    const body = encodeForm(form);
    return (await this.http.send({ method: "POST", path: resource, body })).body;
  }

  private async put(resource: string, form: Form, options?: WriteOptions): Promise<unknown> {
    const headers = await this.precondition(resource, options);
    return (
      await this.http.send({ method: "PUT", path: resource, headers, body: encodeForm(form) })
    ).body;
  }

  /** If-Unmodified-Since for a write: the caller's, else the resource's Last-Modified now. */
  private async precondition(
    resource: string,
    options?: WriteOptions,
  ): Promise<Record<string, string>> {
    const given = options?.ifUnmodifiedSince;
    if (given !== undefined) {
      return { "If-Unmodified-Since": given instanceof Date ? given.toUTCString() : given };
    }
    try {
      const answer = await this.http.send({ method: "GET", path: resource, retry: true });
      const lastModified = answer.headers.get("Last-Modified");
      return lastModified === null ? {} : { "If-Unmodified-Since": lastModified };
    } catch (error) {
      if (error instanceof NotFound) return {}; // Not there yet: the PUT creates it.
      throw error;
    }
  }

  private async *ids(
    listPath: string,
    query: Record<string, readonly string[] | undefined> = {},
  ): AsyncGenerator<string> {
    for await (const url of eachItem(this.http, listPath, query, resultUrls))
      yield lastSegment(url);
  }
}

function consumerPath(channelId: string, consumerId: string): string {
  return path`/channel/${channelId}/consumer/${consumerId}`;
}

/** A form body: lists joined with commas, null a blank field (the default), undefined left out. */
function encodeForm(form: Form): URLSearchParams {
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(form)) {
    if (value === undefined) continue;
    params.append(
      key,
      value === null ? "" : Array.isArray(value) ? value.join(",") : String(value),
    );
  }
  return params;
}
