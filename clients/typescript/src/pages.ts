/**
 * Paginated lists (docs/api.md, "Lists"): 25 items a page and a `Pages.next` link with an opaque
 * cursor. An empty page means there is no more, as in webhook-broker, whose non-empty pages always
 * carry a `next` link.
 */
import type { HttpClient } from "./http.js";
import type { Pages } from "./types.js";

/** The items of one page and its links, read from the page's JSON. */
export type PageReader<Item> = (body: unknown) => { items: readonly Item[]; pages: Pages };

/** Every item of a list, page after page, following `Pages.next` until a page comes back empty. */
export async function* eachItem<Item>(
  http: HttpClient,
  firstPath: string,
  query: Record<string, string | readonly string[] | undefined>,
  read: PageReader<Item>,
): AsyncGenerator<Item, void, undefined> {
  let next: { path: string; query?: typeof query } | null = { path: firstPath, query };
  while (next !== null) {
    const answer = await http.send({ method: "GET", ...next, retry: true });
    const { items, pages } = read(answer.body);
    yield* items;
    next = items.length > 0 && pages.next ? { path: http.resolveLink(pages.next) } : null;
  }
}

/** The reader of the usual list shape, `{"Result": [URLs], "Pages": {…}}`. */
export function resultUrls(body: unknown): { items: readonly string[]; pages: Pages } {
  const page = body as { Result: string[]; Pages: Pages };
  return { items: page.Result, pages: page.Pages };
}

/** The last segment of a resource URL, decoded: the ID in `/channel/orders`. */
export function lastSegment(url: string): string {
  const pathOnly = url.split("?")[0] ?? "";
  return decodeURIComponent(pathOnly.slice(pathOnly.lastIndexOf("/") + 1));
}
