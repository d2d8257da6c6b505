/** A client for the webhook broker: publish (Producer), manage (Admin), verify deliveries. */
export { Admin, type AdminOptions, type ConsumerTokens, type WriteOptions } from "./admin.js";
export {
  BadRequest,
  BrokerError,
  BrokerUnavailable,
  Conflict,
  NotFound,
  PreconditionFailed,
  RateLimited,
  ServerError,
  Unauthorized,
} from "./errors.js";
export { type ClientOptions, DEFAULT_RETRY, type RetryPolicy } from "./http.js";
export {
  type BatchMessage,
  newMessageId,
  type Payload,
  Producer,
  type ProducerOptions,
  type PublishOptions,
} from "./producer.js";
export type * from "./types.js";
export {
  verify,
  type VerifiedWebhook,
  type VerifyOptions,
  type WebhookHeaders,
  WebhookVerificationError,
} from "./verify.js";
