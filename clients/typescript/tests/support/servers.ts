/**
 * Real HTTP servers on 127.0.0.1 for the tests: a proxy in front of the broker that fails the
 * first requests it gets, and a receiver that push consumers deliver to.
 */
import { once } from "node:events";
import { createServer, type IncomingHttpHeaders, request, type Server } from "node:http";
import type { AddressInfo } from "node:net";

/**
 * How the proxy fails its first `count` requests: answer `status` itself (with `retryAfter`
 * seconds when given), drop the connection without an answer, or forward the request to the
 * broker and then answer 503 anyway (the broker did the work but the client never hears of it).
 */
export interface Failures {
  count: number;
  how: "status" | "drop" | "forward-then-503";
  status?: number;
  retryAfter?: string;
}

export interface FailingProxy {
  url: string;
  /** How many requests reached the proxy. */
  requests: number;
  close(): Promise<void>;
}

export async function failingProxy(target: string, failures: Failures): Promise<FailingProxy> {
  const upstream = new URL(target);
  const proxy: FailingProxy = { url: "", requests: 0, close: async () => undefined };
  const server = createServer(async (incoming, outgoing) => {
    const failing = proxy.requests++ < failures.count;
    const body = await readAll(incoming);
    if (failing && failures.how === "drop") {
      incoming.socket.destroy();
      return;
    }
    if (failing && failures.how === "status") {
      const headers: Record<string, string> = { "Content-Type": "application/json" };
      if (failures.retryAfter !== undefined) headers["Retry-After"] = failures.retryAfter;
      outgoing.writeHead(failures.status ?? 503, headers);
      outgoing.end(JSON.stringify({ Error: "the proxy fails this one on purpose" }));
      return;
    }
    const answer = await forward(
      upstream,
      incoming.method ?? "GET",
      incoming.url ?? "/",
      incoming.headers,
      body,
    );
    if (failing) {
      outgoing.writeHead(503, { "Content-Type": "text/plain" });
      outgoing.end("the broker answered, but this proxy lost the answer");
      return;
    }
    outgoing.writeHead(answer.status, answer.headers);
    outgoing.end(answer.body);
  });
  proxy.url = await listen(server);
  proxy.close = () => closeServer(server);
  return proxy;
}

interface Forwarded {
  status: number;
  headers: IncomingHttpHeaders;
  body: Buffer;
}

function forward(
  upstream: URL,
  method: string,
  url: string,
  headers: IncomingHttpHeaders,
  body: Buffer,
): Promise<Forwarded> {
  return new Promise((resolve, reject) => {
    const outgoing = request(
      {
        host: upstream.hostname,
        port: upstream.port,
        method,
        path: url,
        headers: { ...headers, host: upstream.host },
      },
      (answer) => {
        readAll(answer).then(
          (body) => resolve({ status: answer.statusCode ?? 502, headers: answer.headers, body }),
          reject,
        );
      },
    );
    outgoing.on("error", reject);
    outgoing.end(body);
  });
}

export interface Delivery {
  headers: IncomingHttpHeaders;
  body: Buffer;
}

export interface Receiver {
  url: string;
  deliveries: Delivery[];
  close(): Promise<void>;
}

/** A webhook receiver that records every request and answers 204. */
export async function receiver(): Promise<Receiver> {
  const deliveries: Delivery[] = [];
  const server = createServer(async (incoming, outgoing) => {
    const body = await readAll(incoming);
    deliveries.push({ headers: incoming.headers, body });
    outgoing.writeHead(204);
    outgoing.end();
  });
  const url = await listen(server);
  return { url: `${url}/hook`, deliveries, close: () => closeServer(server) };
}

async function readAll(stream: AsyncIterable<Buffer>): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of stream) chunks.push(chunk);
  return Buffer.concat(chunks);
}

async function listen(server: Server): Promise<string> {
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const { port } = server.address() as AddressInfo;
  return `http://127.0.0.1:${port}`;
}

function closeServer(server: Server): Promise<void> {
  server.closeAllConnections();
  return new Promise((resolve, reject) =>
    server.close((error) => (error ? reject(error) : resolve())),
  );
}
