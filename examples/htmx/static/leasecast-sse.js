// Leasecast's server-sent events in an htmx page (examples/htmx/README.md).
//
// The page's URL names the stream: ?gateway=http://127.0.0.1:8000&topic=news&token=...
// (a real application renders sse-connect in its own template instead, with a
// short-lived signed token for `subscribe:TOPIC`).
(function () {
  "use strict";

  const params = new URLSearchParams(window.location.search);
  const gateway = (params.get("gateway") || window.location.origin).replace(/\/$/, "");
  const topic = params.get("topic") || "news";
  const stream = new URL(`${gateway}/sse/topics/${encodeURIComponent(topic)}/`);
  if (params.get("token")) stream.searchParams.set("token", params.get("token"));

  const feed = document.getElementById("feed");
  const status = document.getElementById("status");
  document.getElementById("topic").textContent = topic;
  feed.setAttribute("sse-connect", stream.href);

  // The extension opens EventSources "with credentials" (cookies); Leasecast
  // never allows credentials across origins (the page sends a token), so a
  // page of another origin must open them without.
  htmx.createEventSource = (url) => new EventSource(url);

  // Event data is the message body as JSON, not HTML: show it as text.
  htmx.defineExtension("leasecast-text", {
    transformResponse(text, xhr, elt) {
      const item = document.createElement(elt.tagName === "UL" ? "li" : "span");
      item.textContent = text;
      return item.outerHTML;
    },
  });

  // Resume where the page is. The browser's own reconnect sends the last
  // event id (Last-Event-ID) by itself; when the extension has to open a new
  // EventSource (after the browser gave up), the URL carries the position.
  feed.addEventListener("htmx:sseBeforeMessage", (event) => {
    const id = event.detail.lastEventId || "";
    const colon = id.lastIndexOf(":");
    if (event.detail.type !== "message" || colon < 1) return;
    const url = new URL(feed.getAttribute("sse-connect"));
    url.searchParams.delete("recover");
    url.searchParams.set("epoch", id.slice(0, colon));
    url.searchParams.set("since", id.slice(colon + 1));
    feed.setAttribute("sse-connect", url.href);
  });
  feed.addEventListener("htmx:sseOpen", () => { status.textContent = "live"; });
  feed.addEventListener("htmx:sseError", () => { status.textContent = "reconnecting"; });
})();
