// The client's pure parts, without a socket: `node --test clients/js/test/`.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  Backoff,
  Backpressure,
  BadFrame,
  closeAction,
  CloseCode,
  closeError,
  ConnectionClosed,
  CreditWindow,
  decodeJwtPayload,
  deliveriesOf,
  enqueueFields,
  errorFromFrame,
  Forbidden,
  Invalid,
  LeasecastError,
  buildUrl,
  namePath,
  parseFrame,
  PendingReplies,
  ProtocolError,
  refreshDelay,
  refusedAtOpen,
  ResumePosition,
  StaleReceipt,
  SubscriberCore,
  Unauthorized,
} from "../leasecast.js";

function jwt(claims) {
  const part = (obj) => Buffer.from(JSON.stringify(obj)).toString("base64url");
  return `${part({ alg: "HS256", typ: "JWT" })}.${part(claims)}.c2lnbmF0dXJl`;
}

test("parseFrame accepts JSON objects with an op and refuses the rest as BadFrame", () => {
  assert.deepEqual(parseFrame('{"op":"acked","ref":"r1"}'), { op: "acked", ref: "r1" });
  for (const bad of ["nope", "[1]", "null", '{"ref":1}', '{"op":3}', new ArrayBuffer(2)]) {
    assert.throws(() => parseFrame(bad), BadFrame, String(bad));
  }
});

test("errors are typed by code and keep detail, ref and retry_after", () => {
  const err = errorFromFrame({
    op: "error",
    code: "backpressure",
    detail: "slow down",
    ref: "r7",
    retry_after: 1.5,
  });
  assert.ok(err instanceof Backpressure);
  assert.ok(err instanceof ProtocolError);
  assert.ok(err instanceof LeasecastError);
  assert.ok(err instanceof Error);
  assert.equal(err.name, "Backpressure");
  assert.equal(err.code, "backpressure");
  assert.equal(err.detail, "slow down");
  assert.equal(err.ref, "r7");
  assert.equal(err.retryAfter, 1.5);
  assert.ok(errorFromFrame({ op: "error", code: "stale_receipt" }) instanceof StaleReceipt);
  const unknown = errorFromFrame({ op: "error", code: "brand_new", detail: "?" });
  assert.equal(unknown.constructor, ProtocolError);
  assert.equal(unknown.code, "brand_new");
});

test("credit is granted back in halves of the window", () => {
  const credit = new CreditWindow(10);
  const grants = [];
  for (let i = 0; i < 23; i++) grants.push(credit.consume());
  assert.deepEqual(
    grants.map((g, i) => [i + 1, g]).filter(([, g]) => g > 0),
    [
      [5, 5],
      [10, 5],
      [15, 5],
      [20, 5],
    ],
  );
  // Never more outstanding than the window: granted + window - consumed >= 0 and <= window.
  const one = new CreditWindow(1);
  assert.equal(one.consume(), 1);
  assert.equal(one.consume(), 1);
  credit.reset();
  assert.equal(credit.consumed, 0);
  assert.throws(() => new CreditWindow(0), Invalid);
  assert.throws(() => new CreditWindow(2.5), Invalid);
});

test("backoff doubles up to the cap, with jitter in [c/2, c], and resets", () => {
  const low = new Backoff({ initial: 100, max: 1000, random: () => 0 });
  assert.deepEqual(
    Array.from({ length: 6 }, () => low.next()),
    [50, 100, 200, 400, 500, 500],
  );
  const high = new Backoff({ initial: 100, max: 1000, random: () => 0.999999 });
  const delays = Array.from({ length: 6 }, () => high.next());
  assert.deepEqual(
    delays.map((d) => Math.round(d)),
    [100, 200, 400, 800, 1000, 1000],
  );
  high.reset();
  assert.equal(Math.round(high.next()), 100);
});

test("a new subscriber asks recover=latest only to learn where the stream is", () => {
  const pos = new ResumePosition();
  assert.deepEqual(pos.params(), { recover: "latest" });
  assert.equal(pos.resuming, false);
  const info = pos.subscribed({
    op: "subscribed",
    topic: "t",
    epoch: "e1",
    offset: 41,
    recovered: true,
  });
  assert.equal(info.recovered, true);
  // The replayed latest message (offset 41) is not the page's: dropped.
  assert.equal(pos.accept({ offset: 41 }), false);
  assert.equal(pos.accept({ offset: 42 }), true);
  assert.equal(pos.accept({ offset: 43 }), true);
  assert.equal(pos.accept({ offset: 42 }), false); // never backwards
  assert.deepEqual(pos.params(), { since: 43, epoch: "e1" });
  assert.equal(pos.resuming, true);
});

test("cache mode hands the latest message over once, then resumes", () => {
  const pos = new ResumePosition({ latest: true });
  assert.deepEqual(pos.params(), { recover: "latest" });
  pos.subscribed({ op: "subscribed", epoch: "e", offset: 9, recovered: true });
  assert.equal(pos.accept({ offset: 9 }), true);
  assert.deepEqual(pos.params(), { since: 9, epoch: "e" });
  // Empty history: nothing replayed, live messages follow the topic's offset.
  const empty = new ResumePosition({ latest: true });
  empty.params();
  empty.subscribed({ op: "subscribed", epoch: "e", offset: 0, recovered: false });
  assert.equal(empty.accept({ offset: 1 }), true);
});

test("resume: recovered keeps the offset; not recovered jumps to the live end and says so", () => {
  const pos = new ResumePosition({ since: 10, epoch: "old" });
  assert.deepEqual(pos.params(), { since: 10, epoch: "old" });
  const ok = pos.subscribed({ op: "subscribed", epoch: "old", offset: 15, recovered: true });
  assert.deepEqual(ok, { recovered: true, epoch: "old", offset: 15, since: 10 });
  assert.equal(pos.accept({ offset: 10 }), false);
  assert.equal(pos.accept({ offset: 11 }), true);

  pos.params();
  const lost = pos.subscribed({ op: "subscribed", epoch: "new", offset: 3, recovered: false });
  assert.deepEqual(lost, { recovered: false, epoch: "new", offset: 3, since: 11 });
  assert.deepEqual(pos.params(), { since: 3, epoch: "new" });
  assert.equal(pos.accept({ offset: 4 }), true);
});

test("resume: false on a v1 gateway asks nothing and accepts items without offsets", () => {
  const pos = new ResumePosition({ resume: false });
  assert.deepEqual(pos.params(), {});
  assert.equal(pos.accept({ seq: 1 }), true);
  assert.equal(pos.accept({ seq: 1 }), true);
});

test("subscriber core: drops, dedup across a reconnect, credit only for its own socket", () => {
  const core = new SubscriberCore("prices", { credit: 4 });
  assert.deepEqual(core.openParams(), { credit: 4, recover: "latest" });
  assert.deepEqual(core.handle({ op: "subscribed", epoch: "e", offset: 0, recovered: false }), []);
  const events = core.handle({
    op: "messages",
    topic: "prices",
    dropped: 2,
    items: [
      { seq: 3, offset: 1, body: "a" },
      { seq: 4, offset: 2, body: "b" },
    ],
  });
  assert.deepEqual(
    events.map((e) => e.type),
    ["drop", "message", "message"],
  );
  assert.equal(core.dropped, 2);
  assert.deepEqual(events[1].message, { topic: "prices", seq: 3, offset: 1, body: "a" });
  const oldGeneration = events[1].generation;
  assert.equal(core.consumed(oldGeneration), 0);
  assert.equal(core.consumed(oldGeneration), 2); // half of 4

  // Reconnect: resume from offset 2; the replay repeats 2, which is not fresh.
  assert.deepEqual(core.openParams(), { credit: 4, since: 2, epoch: "e" });
  const replay = core.handle({ op: "subscribed", epoch: "e", offset: 3, recovered: true });
  assert.deepEqual(replay, [
    { type: "recover", info: { recovered: true, epoch: "e", offset: 3, since: 2 } },
  ]);
  const again = core.handle({
    op: "messages",
    topic: "prices",
    dropped: 0,
    items: [
      { seq: 1, offset: 2, body: "b" },
      { seq: 2, offset: 3, body: "c" },
    ],
  });
  assert.deepEqual(
    again.map((e) => e.fresh),
    [false, true],
  );
  // A message of the old socket consumed late grants nothing on the new one.
  assert.equal(core.consumed(oldGeneration), 0);
  assert.equal(core.consumed(again[0].generation), 0);
  assert.equal(core.consumed(again[1].generation), 2);
  const [error] = core.handle({ op: "error", code: "forbidden", detail: "no" });
  assert.ok(error.error instanceof Forbidden);
});

test("JWT claims decode; other tokens are not JWTs", () => {
  assert.deepEqual(decodeJwtPayload(jwt({ sub: "ann", exp: 100, scopes: ["subscribe:*"] })), {
    sub: "ann",
    exp: 100,
    scopes: ["subscribe:*"],
  });
  assert.equal(decodeJwtPayload("lc_stored_token"), null);
  assert.equal(decodeJwtPayload("a.b.c"), null);
  assert.equal(decodeJwtPayload(null), null);
});

test("refresh comes before expiry: lead before the end, not before half-life, never a loop", () => {
  const now = 1_000_000_000_000;
  const sec = now / 1000;
  // One hour: 30 s before the end.
  assert.equal(refreshDelay(jwt({ exp: sec + 3600 }), { now }), 3570_000);
  // One minute: at half-life (30 s), the lead is capped by it.
  assert.equal(refreshDelay(jwt({ exp: sec + 60 }), { now }), 30_000);
  // Ten seconds with a 2 s lead.
  assert.equal(refreshDelay(jwt({ exp: sec + 10 }), { now, lead: 2000 }), 8_000);
  // Already due or expired: the floor, not 0 (no hot loop).
  assert.equal(refreshDelay(jwt({ exp: sec - 5 }), { now }), 1_000);
  // No exp (or a stored token): never.
  assert.equal(refreshDelay(jwt({ sub: "x" }), { now }), null);
  assert.equal(refreshDelay("stored-token", { now }), null);
  // With iat the browser's clock does not matter: a 60 s token obtained 10 s
  // ago by a clock one hour ahead of the server's.
  const skewed = jwt({ iat: sec - 3600, exp: sec - 3600 + 60 });
  assert.equal(refreshDelay(skewed, { now, obtainedAt: now - 10_000 }), 25_000);
});

test("close codes: 4400 and 4403 stop, 4401 renews the token when it can, the rest retries", () => {
  assert.equal(closeAction(4403), "stop");
  assert.equal(closeAction(4400), "stop");
  assert.equal(closeAction(4401), "stop");
  assert.equal(closeAction(4401, { canRenewToken: true }), "token");
  for (const code of [1000, 1001, 1006, 1011, 4000, 4008, 4429]) {
    assert.equal(closeAction(code, { canRenewToken: true }), "retry", String(code));
  }
  assert.ok(closeError(4403, "") instanceof Forbidden);
  assert.ok(closeError(4400, "") instanceof Invalid);
  assert.ok(closeError(4401, "") instanceof Unauthorized);
  assert.ok(closeError(1006, "") instanceof ConnectionClosed);
  const sent = errorFromFrame({ op: "error", code: "forbidden", detail: "not prices" });
  assert.equal(closeError(4403, "", sent), sent);
});

test("a socket refused right after opening is told apart from one that was lost", () => {
  const told = [{ op: "error", code: "unauthorized" }];
  assert.equal(refusedAtOpen(4401, told), true);
  // Expired or revoked after it worked: frames came before the close.
  assert.equal(refusedAtOpen(4401, [{ op: "subscribed" }, ...told]), false);
  assert.equal(refusedAtOpen(4401, []), false);
  assert.equal(refusedAtOpen(1006, []), false);
  assert.equal(refusedAtOpen(4403, [{ op: "error", code: "forbidden" }]), false);
  assert.equal(refusedAtOpen(1000, told), false);
});

test("pending replies settle by ref, reject typed errors, and fail together on close", async () => {
  const pending = new PendingReplies();
  const a = pending.add();
  const b = pending.add();
  const c = pending.add();
  assert.notEqual(a.ref, b.ref);
  assert.equal(pending.settle({ op: "acked", ref: a.ref }), true);
  assert.deepEqual(await a.promise, { op: "acked", ref: a.ref });
  assert.equal(pending.settle({ op: "error", code: "stale_receipt", ref: b.ref }), true);
  await assert.rejects(b.promise, StaleReceipt);
  assert.equal(pending.settle({ op: "deliver" }), false);
  assert.equal(pending.settle({ op: "acked", ref: "someone-else" }), false);
  pending.failAll(new ConnectionClosed(1006));
  await assert.rejects(c.promise, ConnectionClosed);
  assert.equal(pending.size, 0);
});

test("deliveries of deliver and deliveries frames; enqueue fields only when set", () => {
  const one = deliveriesOf({
    op: "deliver",
    queue: "q",
    id: "1",
    receipt: "1.x",
    body: { a: 1 },
    deliveries: 2,
    expires_in: 30,
  });
  assert.deepEqual(one, [
    {
      queue: "q",
      id: "1",
      receipt: "1.x",
      body: { a: 1 },
      deliveries: 2,
      expiresIn: 30,
      group: undefined,
      priority: undefined,
    },
  ]);
  const many = deliveriesOf({
    op: "deliveries",
    queue: "q",
    items: [
      { id: "1", receipt: "1.a", body: 1, deliveries: 1, expires_in: 5, group: "g", priority: 3 },
      { id: "2", receipt: "2.b", body: 2, deliveries: 1, expires_in: 5 },
    ],
  });
  assert.deepEqual(
    many.map((d) => [d.queue, d.id, d.group, d.priority]),
    [
      ["q", "1", "g", 3],
      ["q", "2", undefined, undefined],
    ],
  );
  assert.deepEqual(deliveriesOf({ op: "acked" }), []);
  assert.deepEqual(enqueueFields({}), {});
  assert.deepEqual(enqueueFields({ key: "k", delay: 0, priority: 0, group: "g", ttl: 60 }), {
    key: "k",
    group: "g",
    ttl: 60,
  });
});

test("URLs: http becomes ws, https wss, names are encoded, unset params left out", () => {
  assert.equal(
    buildUrl("http://127.0.0.1:8000", namePath("/ws/topics/", "prices"), {
      credit: 64,
      since: undefined,
      token: "a b",
    }),
    "ws://127.0.0.1:8000/ws/topics/prices/?credit=64&token=a+b",
  );
  assert.equal(buildUrl("https://x.example/app/", "/ws/produce/"), "wss://x.example/ws/produce/");
  assert.equal(namePath("ws/queues", "a/b c"), "/ws/queues/a%2Fb%20c/");
});

test("CloseCode names the close codes the client acts on, and cannot be changed", () => {
  assert.ok(Object.isFrozen(CloseCode));
  assert.equal(closeAction(CloseCode.INVALID), "stop");
  assert.equal(closeAction(CloseCode.FORBIDDEN), "stop");
  assert.equal(closeAction(CloseCode.UNAUTHORIZED, { canRenewToken: true }), "token");
  for (const code of [CloseCode.GOING_AWAY, CloseCode.SLOW_CONSUMER, CloseCode.STREAM_RESTARTED]) {
    assert.equal(closeAction(code), "retry");
  }
  assert.ok(closeError(CloseCode.FORBIDDEN, "", null) instanceof Forbidden);
  assert.equal(new ConnectionClosed().code, CloseCode.ABNORMAL_CLOSURE);
});
