/**
 * A pull consumer's two calls, made by hand: the tests use them to move jobs (to DEAD for the
 * dead-letter queue, to DELIVERED for a replay). The client itself has no pull worker.
 */
import { brokerUrl } from "./broker.js";

export interface PullConsumer {
  channelId: string;
  consumerId: string;
  channelToken: string;
  consumerToken: string;
}

async function call(consumer: PullConsumer, action: string, body: object): Promise<unknown> {
  const url = `${brokerUrl}/channel/${consumer.channelId}/consumer/${consumer.consumerId}/${action}`;
  const response = await fetch(url, {
    method: "POST",
    headers: {
      "Content-Type": "application/json",
      "X-Broker-Channel-Token": consumer.channelToken,
      "X-Broker-Consumer-Token": consumer.consumerToken,
    },
    body: JSON.stringify(body),
  });
  if (!response.ok) throw new Error(`${action}: HTTP ${response.status} ${await response.text()}`);
  return response.json();
}

/** Claims up to `limit` jobs and reports them all as `nextState`; returns their IDs. */
export async function claimAndReport(
  consumer: PullConsumer,
  limit: number,
  nextState: "DEAD" | "DELIVERED",
): Promise<string[]> {
  const claimed = (await call(consumer, "claim", { limit })) as { Result: { ID: string }[] };
  const ids = claimed.Result.map((job) => job.ID);
  const jobs = ids.map((ID) =>
    nextState === "DEAD"
      ? { ID, NextState: nextState, Error: "refused by the test" }
      : { ID, NextState: nextState },
  );
  if (jobs.length > 0) await call(consumer, "report", { Jobs: jobs });
  return ids;
}
