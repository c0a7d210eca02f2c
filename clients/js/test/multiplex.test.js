// The multiplexed socket's pure parts: the subscribe frame and presence changes.
import assert from "node:assert/strict";
import { test } from "node:test";

import { SubscriberCore, presenceChanges, subscribeFrame } from "../leasecast.js";

test("a subscribe frame carries the options and the core's resume position", () => {
  const core = new SubscriberCore("prices", { credit: 8, since: 41, epoch: "e1" });
  const frame = subscribeFrame(
    "prices",
    { capacity: 10, onFull: "block", presence: true },
    core.openParams(),
  );
  assert.deepEqual(frame, {
    op: "subscribe",
    topic: "prices",
    ref: "sub:prices",
    capacity: 10,
    on_full: "block",
    presence: true,
    credit: 8,
    since: 41,
    epoch: "e1",
  });
});

test("without a position the frame asks recover=latest, and leaves out what is unset", () => {
  const core = new SubscriberCore("news");
  const frame = subscribeFrame("news", {}, core.openParams());
  assert.deepEqual(frame, {
    op: "subscribe",
    topic: "news",
    ref: "sub:news",
    credit: 256,
    recover: "latest",
  });
});

test("the /ws/ subscribed reply (recovered null) starts the position", () => {
  const core = new SubscriberCore("news", { resume: false });
  core.openParams();
  assert.deepEqual(core.handle({ op: "subscribed", topic: "news", epoch: "e", offset: 7, recovered: null }), []);
  assert.deepEqual(core.position.known, true);
  const events = core.handle({
    op: "messages",
    topic: "news",
    items: [{ seq: 1, offset: 8, body: "x" }],
    dropped: 0,
  });
  assert.equal(events.length, 1);
  assert.equal(events[0].fresh, true);
});

test("presence, join and leave frames as member changes", () => {
  const alice = { client: "c1", user: "alice", info: { name: "Alice" } };
  assert.deepEqual(presenceChanges({ op: "presence", topic: "t", joins: [alice], leaves: [] }), {
    joins: [alice],
    leaves: [],
  });
  assert.deepEqual(presenceChanges({ op: "join", topic: "t", ...alice }), {
    joins: [alice],
    leaves: [],
  });
  assert.deepEqual(presenceChanges({ op: "leave", topic: "t", client: "c1", user: "alice" }), {
    joins: [],
    leaves: [{ client: "c1", user: "alice" }],
  });
  assert.deepEqual(presenceChanges({ op: "messages" }), { joins: [], leaves: [] });
});
