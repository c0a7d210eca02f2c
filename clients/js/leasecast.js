// Leasecast client for browsers (and Node with a WebSocket implementation).
//
// One ES module, no build step, no runtime dependency. The gateway serves it at
// /static/leasecast/leasecast.js; clients/js is also an npm package.
//
//   import { Leasecast } from "/static/leasecast/leasecast.js";
//   const client = new Leasecast(location.origin, { getToken });
//   client.subscribe("prices", { onMessage: (m) => show(m.body) });
//
// The wire protocol is docs/protocol.md. The module has two layers: pure state
// machines (frame parsing, credit, backoff, resume position, token refresh
// timing, close decisions), exported so that `node --test` checks them without
// a socket, and the WebSocket I/O (Link and its subclasses) that drives them.

export const VERSION = "0.1.0";

// ---------------------------------------------------------------- errors ----

/**
 * The WebSocket close codes of the gateway (docs/protocol.md, Errors). The
 * Python client's `leasecast.CloseCode` holds the same names and numbers; a
 * test checks that the two agree.
 */
export const CloseCode = Object.freeze({
  NORMAL_CLOSURE: 1000,
  GOING_AWAY: 1001,
  ABNORMAL_CLOSURE: 1006,
  MESSAGE_TOO_BIG: 1009,
  DISCONNECTED_BY_OPERATOR: 4000,
  SLOW_CONSUMER: 4008,
  INVALID: 4400,
  UNAUTHORIZED: 4401,
  FORBIDDEN: 4403,
  STREAM_RESTARTED: 4409,
  TOO_MANY_SOCKETS: 4429,
  UNAVAILABLE: 4503,
});


/** Root of every error this client raises. */
export class LeasecastError extends Error {
  constructor(message) {
    super(message);
    this.name = new.target.name;
  }
}

/** An `error` frame (or HTTP error) from the gateway; `code` is its wire code. */
export class ProtocolError extends LeasecastError {
  static code = "internal";

  constructor(detail = "", { code, ref, retryAfter, frame } = {}) {
    super(detail || code || new.target.code);
    this.code = code || new.target.code;
    this.detail = detail || this.code;
    this.ref = ref;
    /** Seconds until the same frame would be admitted (`backpressure` only), or undefined. */
    this.retryAfter = retryAfter;
    this.frame = frame;
  }
}

export class BadFrame extends ProtocolError {
  static code = "bad_frame";
}
export class UnknownOp extends ProtocolError {
  static code = "unknown_op";
}
export class Invalid extends ProtocolError {
  static code = "invalid";
}
export class TooLarge extends ProtocolError {
  static code = "too_large";
}
export class Unauthorized extends ProtocolError {
  static code = "unauthorized";
}
export class Forbidden extends ProtocolError {
  static code = "forbidden";
}
export class StaleReceipt extends ProtocolError {
  static code = "stale_receipt";
}
export class NotFound extends ProtocolError {
  static code = "not_found";
}
export class Backpressure extends ProtocolError {
  static code = "backpressure";
}
export class Unavailable extends ProtocolError {
  static code = "unavailable";
}

/** The socket closed (or never opened); `code` and `reason` are the WebSocket close's. */
export class ConnectionClosed extends LeasecastError {
  constructor(code = CloseCode.ABNORMAL_CLOSURE, reason = "") {
    super(`connection closed (${code}${reason ? `: ${reason}` : ""})`);
    this.code = code;
    this.reason = reason;
  }
}

const ERRORS_BY_CODE = Object.freeze(
  Object.fromEntries(
    [
      BadFrame,
      UnknownOp,
      Invalid,
      TooLarge,
      Unauthorized,
      Forbidden,
      StaleReceipt,
      NotFound,
      Backpressure,
      Unavailable,
    ].map((cls) => [cls.code, cls]),
  ),
);

/** The typed error for an `error` frame: `Forbidden` for code `forbidden`, and so on. */
export function errorFromFrame(frame) {
  const code = typeof frame.code === "string" ? frame.code : "internal";
  const cls = ERRORS_BY_CODE[code] || ProtocolError;
  return new cls(typeof frame.detail === "string" ? frame.detail : "", {
    code,
    ref: frame.ref,
    retryAfter: typeof frame.retry_after === "number" ? frame.retry_after : undefined,
    frame,
  });
}

// ----------------------------------------------------------- pure parts ----

/**
 * One text frame from the gateway as an object with a string `op`.
 * @throws {BadFrame} binary data, not JSON, not an object, or no `op`.
 */
export function parseFrame(data) {
  if (typeof data !== "string") throw new BadFrame("a binary frame (frames are JSON text)");
  let frame;
  try {
    frame = JSON.parse(data);
  } catch {
    throw new BadFrame("not JSON");
  }
  if (frame === null || typeof frame !== "object" || Array.isArray(frame)) {
    throw new BadFrame("not a JSON object");
  }
  if (typeof frame.op !== "string") throw new BadFrame("no op");
  return frame;
}

/** `ws(s)://host/PATH?QUERY` from a base URL (http, https, ws, wss); undefined/null params are left out. */
export function buildUrl(base, path, params = {}) {
  const url = new URL(path, base);
  url.protocol = { "http:": "ws:", "https:": "wss:" }[url.protocol] || url.protocol;
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null) url.searchParams.set(key, String(value));
  }
  return url.toString();
}

/** `/PREFIX/NAME/` with the name percent-encoded (a bad name gets `invalid`, not a broken URL). */
export function namePath(prefix, name) {
  return `/${prefix.replace(/^\/+|\/+$/g, "")}/${encodeURIComponent(name)}/`;
}

/**
 * Credit for a subscriber: the gateway sends at most `window` messages ahead of
 * what the page has consumed. Credit is granted back in halves of the window:
 * few `credit` frames, and the gateway never waits for the page's last message.
 */
export class CreditWindow {
  constructor(window = 256) {
    if (!Number.isInteger(window) || window < 1) {
      throw new Invalid(`credit must be an integer >= 1, got ${window}`);
    }
    this.window = window;
    this.consumed = 0;
  }

  /** Count `n` consumed messages; returns the credit to grant now (0: none yet). */
  consume(n = 1) {
    this.consumed += n;
    if (this.consumed >= Math.max(1, Math.floor(this.window / 2))) {
      const grant = this.consumed;
      this.consumed = 0;
      return grant;
    }
    return 0;
  }

  /** A new socket starts with the whole window as its initial credit. */
  reset() {
    this.consumed = 0;
  }
}

/**
 * Reconnect delays in milliseconds: exponential, capped, with jitter. The n-th
 * delay is uniform in [c/2, c], where the ceiling c starts at `initial` and
 * doubles up to `max`. Jitter spreads out the clients that lost the gateway
 * together; the floor c/2 keeps a refused client from hammering it.
 */
export class Backoff {
  constructor({ initial = 100, max = 5000, random = Math.random } = {}) {
    this.initial = Math.min(initial, max);
    this.max = max;
    this.random = random;
    this.ceiling = this.initial;
  }

  next() {
    const ceiling = this.ceiling;
    this.ceiling = Math.min(this.max, this.ceiling * 2);
    return ceiling / 2 + this.random() * (ceiling / 2);
  }

  reset() {
    this.ceiling = this.initial;
  }
}

/**
 * Where a subscriber is in a topic's stream: the epoch and the offset of the
 * last message handed to the page. Gives the URL parameters that resume from
 * there, reads the `subscribed` answer, and drops what was already seen.
 *
 * Without a known position it asks for `recover=latest`, only to learn the
 * topic's epoch and offset: the replayed latest message (offset <= that) is
 * dropped unless `latest` is set (cache mode: the page wants it).
 */
export class ResumePosition {
  constructor({ since, epoch, latest = false, resume = true } = {}) {
    this.epoch = epoch ?? null;
    this.offset = since ?? null;
    this.latest = latest;
    this.resume = resume;
    this._asked = null; // what the open socket asked for: "since", "latest" or null
  }

  get known() {
    return this.epoch !== null && this.offset !== null;
  }

  /** The query parameters of the next socket, and remember what they asked. */
  params() {
    if (this.known) {
      this._asked = "since";
      return { since: this.offset, epoch: this.epoch };
    }
    if (this.resume || this.latest) {
      this._asked = "latest";
      return { recover: "latest" };
    }
    this._asked = null;
    return {};
  }

  /** Did the open socket ask to resume a known position (so the page must hear the outcome)? */
  get resuming() {
    return this._asked === "since";
  }

  /**
   * Read a `subscribed` frame. Returns `{recovered, epoch, offset, since}`:
   * `recovered` false means messages after `since` were lost (another epoch,
   * or older than the history kept); only live messages follow.
   */
  subscribed(frame) {
    const since = this.offset;
    const asked = this._asked;
    const recovered = frame.recovered === true;
    this.epoch = frame.epoch ?? null;
    if (asked === "since" && recovered) {
      // The replay starts right after our offset: keep it.
    } else if (asked === "latest" && this.latest && recovered && typeof frame.offset === "number") {
      this.offset = frame.offset - 1; // cache mode: hand the latest message to the page
      this.latest = false; // only the first time: a reconnect resumes instead
    } else {
      this.offset = typeof frame.offset === "number" ? frame.offset : null;
    }
    return {
      recovered: asked === "since" ? recovered : true,
      epoch: this.epoch,
      offset: frame.offset,
      since: asked === "since" ? since : null,
    };
  }

  /** Record a message's offset; false for one already handed over (a replay's duplicate). */
  accept(item) {
    if (typeof item.offset !== "number") return true; // a v1 gateway: no offsets
    if (this.offset !== null && item.offset <= this.offset) return false;
    this.offset = item.offset;
    return true;
  }
}

function base64UrlDecode(text) {
  const b64 = text.replace(/-/g, "+").replace(/_/g, "/");
  const padded = b64 + "=".repeat((4 - (b64.length % 4)) % 4);
  const binary = globalThis.atob(padded);
  const bytes = Uint8Array.from(binary, (c) => c.charCodeAt(0));
  return new TextDecoder().decode(bytes);
}

/** The claims of a JWT (not verified: the gateway does that), or null for any other token. */
export function decodeJwtPayload(token) {
  if (typeof token !== "string") return null;
  const parts = token.split(".");
  if (parts.length !== 3) return null;
  try {
    const claims = JSON.parse(base64UrlDecode(parts[1]));
    return claims && typeof claims === "object" && !Array.isArray(claims) ? claims : null;
  } catch {
    return null;
  }
}

/**
 * Milliseconds from `now` until the token should be refreshed, or null for a
 * token without `exp` (a stored token lives until revoked).
 *
 * The token's remaining life is measured from when it was obtained: with an
 * `iat` claim as `exp - iat` minus the time since (immune to a wrong clock in
 * the browser), else as `exp` minus the local clock. The refresh comes at
 * `lead` before the end, but never before half of the remaining life, and
 * never sooner than `floor` (a token that is already due cannot spin a loop).
 */
export function refreshDelay(token, { obtainedAt, now, lead = 30_000, floor = 1_000 } = {}) {
  const claims = decodeJwtPayload(token);
  if (!claims || typeof claims.exp !== "number") return null;
  now = now ?? Date.now();
  obtainedAt = obtainedAt ?? now;
  let remaining;
  if (typeof claims.iat === "number" && claims.iat <= claims.exp) {
    remaining = (claims.exp - claims.iat) * 1000 - (now - obtainedAt);
  } else {
    remaining = claims.exp * 1000 - now;
  }
  const early = Math.min(lead, Math.max(remaining, 0) / 2);
  return Math.max(floor, remaining - early);
}

/**
 * What to do after a socket closed with `code`:
 * - "stop": reconnecting cannot help (4400 bad URL, 4403 outside the token's
 *   scopes; 4401 when there is no `getToken` to get a new token);
 * - "token": the token expired, was revoked or was refused (4401): reconnect
 *   at once with a fresh one from `getToken` (then with backoff, if the new
 *   ones are refused too);
 * - "retry": reconnect after a backoff (network loss, restart 1001, slow
 *   consumer 4008, too many sockets 4429, a dashboard disconnect 4000...).
 */
export function closeAction(code, { canRenewToken = false } = {}) {
  if (code === CloseCode.INVALID || code === CloseCode.FORBIDDEN) return "stop";
  if (code === CloseCode.UNAUTHORIZED) return canRenewToken ? "token" : "stop";
  return "retry";
}

/**
 * Was this socket refused rather than lost? A gateway of protocol 1.2 accepts
 * a browser's socket whose token it refuses, sends one `unauthorized` error
 * and closes with 4401 (a browser would show a refused handshake as 1006, like
 * a network failure). `frames` are the ops and codes the socket received.
 */
export function refusedAtOpen(code, frames) {
  return (
    code === CloseCode.UNAUTHORIZED &&
    frames.length === 1 &&
    frames[0].op === "error" &&
    frames[0].code === "unauthorized"
  );
}

/** The typed error for a final close, preferring the `error` frame the gateway sent just before. */
export function closeError(code, reason, lastError) {
  if (lastError instanceof ProtocolError) return lastError;
  if (code === CloseCode.FORBIDDEN) return new Forbidden(reason || "outside the token's scopes");
  if (code === CloseCode.INVALID) return new Invalid(reason || "invalid socket parameters");
  if (code === CloseCode.UNAUTHORIZED) return new Unauthorized(reason || "token expired or revoked");
  return new ConnectionClosed(code, reason);
}

/** Replies matched to requests by `ref`. */
export class PendingReplies {
  constructor(prefix = "r") {
    this.prefix = prefix;
    this.counter = 0;
    this.waiting = new Map();
  }

  get size() {
    return this.waiting.size;
  }

  /** A fresh ref and the promise of its reply (rejected with the typed error for an `error`). */
  add() {
    const ref = `${this.prefix}${++this.counter}`;
    let settle;
    const promise = new Promise((resolve, reject) => {
      settle = { resolve, reject };
    });
    this.waiting.set(ref, settle);
    return { ref, promise };
  }

  /** Settle the request this frame answers; false if it answers none of ours. */
  settle(frame) {
    if (frame.ref === undefined || !this.waiting.has(frame.ref)) return false;
    const { resolve, reject } = this.waiting.get(frame.ref);
    this.waiting.delete(frame.ref);
    if (frame.op === "error") reject(errorFromFrame(frame));
    else resolve(frame);
    return true;
  }

  /** Reject every open request (the socket closed: their outcome is unknown). */
  failAll(error) {
    const waiting = [...this.waiting.values()];
    this.waiting.clear();
    for (const { reject } of waiting) reject(error);
  }
}

/**
 * A subscriber's frame handling, without the socket: what `subscribed` and
 * `messages` frames mean for the page. `handle(frame)` returns events, in
 * order: `{type: "recover", info}`, `{type: "drop", n}`,
 * `{type: "message", message}`, `{type: "error", error}`.
 */
export class SubscriberCore {
  constructor(topic, { credit = 256, since, epoch, recover, resume = true } = {}) {
    this.topic = topic;
    this.credit = new CreditWindow(credit);
    this.position = new ResumePosition({ since, epoch, latest: recover === "latest", resume });
    this.generation = 0; // one per socket: credit of an old socket is never granted on a new one
    this.dropped = 0;
    this.sawSubscribed = false;
  }

  /** Query parameters of the next socket (and start its credit window). */
  openParams() {
    this.generation += 1;
    this.credit.reset();
    this.sawSubscribed = false;
    return { credit: this.credit.window, ...this.position.params() };
  }

  handle(frame) {
    const events = [];
    if (frame.op === "subscribed") {
      this.sawSubscribed = true;
      const resuming = this.position.resuming;
      const info = this.position.subscribed(frame);
      if (resuming) events.push({ type: "recover", info });
    } else if (frame.op === "messages") {
      const dropped = Number(frame.dropped) || 0;
      if (dropped > 0) {
        this.dropped += dropped;
        events.push({ type: "drop", n: dropped });
      }
      const generation = this.generation;
      for (const item of Array.isArray(frame.items) ? frame.items : []) {
        events.push({
          type: "message",
          generation,
          fresh: this.position.accept(item),
          message: Object.freeze({
            topic: frame.topic ?? this.topic,
            seq: item.seq,
            offset: item.offset,
            body: item.body,
          }),
        });
      }
    } else if (frame.op === "error") {
      events.push({ type: "error", error: errorFromFrame(frame) });
    }
    return events;
  }

  /** One message of socket `generation` consumed: the credit to grant now, or 0. */
  consumed(generation) {
    if (generation !== this.generation) return 0;
    return this.credit.consume(1);
  }
}

/** The deliveries in a `deliver` or `deliveries` frame, as plain records. */
export function deliveriesOf(frame) {
  const items =
    frame.op === "deliver" ? [frame] : frame.op === "deliveries" ? frame.items || [] : [];
  return items.map((item) => ({
    queue: item.queue ?? frame.queue,
    id: item.id,
    receipt: item.receipt,
    body: item.body,
    deliveries: item.deliveries,
    expiresIn: item.expires_in,
    group: item.group,
    priority: item.priority,
  }));
}

/** The optional ENQUEUE fields that are set (a v1 gateway sees exactly a v1 frame). */
export function enqueueFields({ key, delay, group, priority, ttl } = {}) {
  const fields = {};
  if (key !== undefined && key !== null) fields.key = key;
  if (delay !== undefined && delay !== null && delay !== 0) fields.delay = delay;
  if (group !== undefined && group !== null) fields.group = group;
  if (priority !== undefined && priority !== null && priority !== 0) fields.priority = priority;
  if (ttl !== undefined && ttl !== null) fields.ttl = ttl;
  return fields;
}

// ----------------------------------------------------------- the sockets ----

const OPEN = 1;
const MAX_TIMER_MS = 2 ** 31 - 1;
// A socket that lived this long was healthy: the next loss starts the backoff over.
const HEALTHY_MS = 5_000;

function defaultBaseUrl() {
  const location = globalThis.location;
  if (location && location.origin && location.origin !== "null") return location.origin;
  throw new Invalid("no gateway URL given and no page location to take it from");
}

/**
 * One reconnecting WebSocket: token in the URL, `refresh` before expiry, replies
 * by `ref`, backoff with jitter. Subclasses say which socket and what its frames mean.
 */
class Link {
  constructor(client, { onError, onStateChange } = {}) {
    this.client = client;
    this.backoff = new Backoff(client.backoffOptions);
    this.pending = new PendingReplies();
    this.onErrorCallback = onError;
    this.onStateChange = onStateChange;
    this.state = "idle";
    this.ws = null;
    this.closed = false;
    this.reconnects = 0;
    this.lastError = null;
    this.error = null; // the final error, once stopped
    this._timers = new Set();
    this._waiters = [];
    this._everOpened = false;
    this._forceToken = false;
    this._tokenRetry = false;
    this.done = new Promise((resolve) => {
      this._resolveDone = resolve;
    });
  }

  /** Open the socket (reconnects follow by themselves until close()). */
  start() {
    this._connect();
    return this;
  }

  _setState(state, info = {}) {
    this.state = state;
    this._call(this.onStateChange, state, info);
  }

  _call(callback, ...args) {
    if (!callback) return undefined;
    try {
      const result = callback(...args);
      if (result && typeof result.then === "function") {
        return result.then(undefined, (err) => this._reportError(err));
      }
      return result;
    } catch (err) {
      this._reportError(err);
      return undefined;
    }
  }

  _reportError(err) {
    const handler = this.onErrorCallback || this.client.onError;
    if (handler) {
      try {
        handler(err);
      } catch {
        // An error handler that throws has nobody left to tell.
      }
    } else if (globalThis.console) {
      globalThis.console.error("leasecast:", err);
    }
  }

  _later(ms, fn) {
    // setTimeout fires at once for more than 2^31-1 ms (a token valid for a month).
    const timer = setTimeout(() => {
      this._timers.delete(timer);
      fn();
    }, Math.min(ms, MAX_TIMER_MS));
    this._timers.add(timer);
    return timer;
  }

  _clearTimers() {
    for (const timer of this._timers) clearTimeout(timer);
    this._timers.clear();
  }

  async _connect() {
    if (this.closed) return;
    this._setState(this._everOpened ? "reconnecting" : "connecting");
    let token;
    try {
      token = await this.client._token({ fresh: this._forceToken });
    } catch (err) {
      this._reportError(err);
      this._retryAfter(this.backoff.next());
      return;
    }
    this._forceToken = false;
    if (this.closed) return;
    const url = buildUrl(this.client.url, this.path(), {
      ...this.params(),
      token: token ?? undefined,
    });
    let ws;
    try {
      ws = new this.client.WebSocket(url);
    } catch (err) {
      // A URL the WebSocket refuses (a bad scheme or port) never gets better.
      this._stop(new Invalid(`cannot open ${url.split("?")[0]}: ${err && err.message}`));
      return;
    }
    this.ws = ws;
    let openedAt = null;
    // The first frames of this socket, and what its opening counted: a socket
    // refused right after opening (refusedAtOpen) is undone as never opened.
    const received = [];
    let counted = null;
    ws.onopen = () => {
      if (this.ws !== ws) return;
      openedAt = Date.now();
      counted = { everOpened: this._everOpened, reconnect: this._everOpened };
      if (this._everOpened) this.reconnects += 1;
      this._everOpened = true;
      this.lastError = null;
      this._scheduleRefresh(ws, token);
      this._setState("open");
      this.opened(ws);
      for (const resolve of this._waiters.splice(0)) resolve();
    };
    ws.onmessage = (event) => {
      if (this.ws !== ws) return;
      let frame;
      try {
        frame = parseFrame(event.data);
      } catch (err) {
        this._reportError(err);
        return;
      }
      if (received.length < 2) received.push({ op: frame.op, code: frame.code });
      if (this.pending.settle(frame)) return;
      if (frame.op === "error") this.lastError = errorFromFrame(frame);
      this.frame(frame, ws);
    };
    ws.onerror = () => {
      // A close event always follows; it carries the code.
    };
    ws.onclose = (event) => {
      if (this.ws !== ws) return;
      this.ws = null;
      if (counted !== null && refusedAtOpen(event.code, received)) {
        // Refused, not lost: the page's stream never started on this socket.
        this._everOpened = counted.everOpened;
        if (counted.reconnect) this.reconnects -= 1;
        openedAt = null;
      }
      this._lost(event.code, event.reason || "", openedAt);
    };
  }

  _lost(code, reason, openedAt) {
    this._clearTimers();
    // Requests sent on a socket whose token was refused fail as what they are.
    const refused = code === CloseCode.UNAUTHORIZED && this.lastError instanceof Unauthorized;
    this.pending.failAll(refused ? this.lastError : new ConnectionClosed(code, reason));
    this.lost();
    if (this.closed) {
      this._finish(null);
      return;
    }
    if (openedAt !== null && Date.now() - openedAt >= HEALTHY_MS) {
      this.backoff.reset();
      this._tokenRetry = false;
    }
    if (openedAt === null && this.client.getToken) {
      // Browsers do not show why a handshake failed (a 403 is a bare 1006):
      // perhaps the token was refused, so the next attempt gets a new one. A
      // gateway of protocol 1.2 says so instead (4401 after `unauthorized`).
      this._forceToken = true;
    }
    const action = closeAction(code, { canRenewToken: Boolean(this.client.getToken) });
    if (action === "stop") {
      this._stop(closeError(code, reason, this.lastError));
      return;
    }
    let delay;
    if (action === "token") {
      this._forceToken = true;
      // At once the first time; if new tokens keep being refused, back off.
      delay = this._tokenRetry ? this.backoff.next() : 0;
      this._tokenRetry = true;
    } else {
      delay = this.backoff.next();
    }
    this._setState("reconnecting", { code, reason, delay });
    this._retryAfter(delay);
  }

  _retryAfter(delay) {
    if (this.closed) return;
    this._later(delay, () => this._connect());
  }

  _stop(error) {
    this.closed = true;
    this.error = error;
    this._clearTimers();
    // The gateway's `error` frame before the close was reported when it came.
    if (error !== this.lastError) this._reportError(error);
    this._finish(error);
  }

  _finish(error) {
    this._setState("closed", error ? { error } : {});
    for (const resolve of this._waiters.splice(0)) resolve();
    this._resolveDone(error);
  }

  _scheduleRefresh(ws, token) {
    const delay = refreshDelay(token, {
      obtainedAt: this.client._tokenObtainedAt,
      lead: this.client.refreshLead,
    });
    if (delay === null || !this.client.getToken) return;
    this._later(delay, async () => {
      if (this.ws !== ws || ws.readyState !== OPEN) return;
      let fresh;
      try {
        // Another socket may have fetched a newer token already: share it.
        fresh = await this.client._token({ fresh: this.client.token === token });
        await this._request(ws, { op: "refresh", token: fresh });
      } catch (err) {
        // The socket will be closed with 4401 at expiry and reconnect with a new token.
        this._reportError(err);
        return;
      }
      this._tokenRetry = false;
      this._scheduleRefresh(ws, fresh);
    });
  }

  /** Resolves once a socket is open (or the link has stopped). */
  whenOpen() {
    if (this.ws && this.ws.readyState === OPEN) return Promise.resolve();
    if (this.closed) return Promise.reject(this.error || new ConnectionClosed(CloseCode.NORMAL_CLOSURE, "closed"));
    return new Promise((resolve) => this._waiters.push(resolve)).then(() => {
      if (!this.ws || this.ws.readyState !== OPEN) {
        throw this.error || new ConnectionClosed(CloseCode.NORMAL_CLOSURE, "closed");
      }
    });
  }

  _request(ws, frame) {
    if (!ws || ws.readyState !== OPEN || this.ws !== ws) {
      return Promise.reject(new ConnectionClosed(CloseCode.ABNORMAL_CLOSURE, "not connected"));
    }
    const { ref, promise } = this.pending.add();
    ws.send(JSON.stringify({ ...frame, ref }));
    return promise;
  }

  /** Send a frame and return its reply (waits for a connection first). */
  async request(frame) {
    await this.whenOpen();
    return this._request(this.ws, frame);
  }

  /** Close for good. Resolves when the socket has closed. */
  close() {
    if (!this.closed) {
      this.closed = true;
      this._clearTimers();
      const ws = this.ws;
      if (ws && ws.readyState <= OPEN) {
        ws.close(CloseCode.NORMAL_CLOSURE);
      } else {
        this.ws = null;
        this._finish(null);
      }
    }
    return this.done.then(() => undefined);
  }

  // -- for subclasses
  path() {
    throw new Error("abstract");
  }
  params() {
    return {};
  }
  opened(_ws) {}
  frame(_frame, _ws) {}
  lost() {}
}

/**
 * A topic subscription: `client.subscribe(topic, options)`. Grants credit as
 * the page consumes, reconnects with backoff and resumes from its last offset
 * and epoch; `onRecover` says whether a resume recovered everything.
 */
export class Subscription extends Link {
  constructor(client, topic, options = {}) {
    super(client, options);
    this.topic = topic;
    this.options = options;
    this.core = new SubscriberCore(topic, options);
    this._chain = Promise.resolve();
  }

  path() {
    return namePath("/ws/topics/", this.topic);
  }

  params() {
    const o = this.options;
    return {
      capacity: o.capacity,
      on_full: o.onFull,
      priority: o.priority,
      ...this.core.openParams(),
    };
  }

  /** `{epoch, offset}` of the last message received (save it to resume after a reload). */
  get position() {
    return { epoch: this.core.position.epoch, offset: this.core.position.offset };
  }

  /** Messages this subscription lost to its buffer policy, as the gateway reported. */
  get dropped() {
    return this.core.dropped;
  }

  frame(frame, ws) {
    if (this.closed) return; // close() was called: nothing more for the page
    for (const event of this.core.handle(frame)) {
      if (event.type === "recover") {
        this._call(this.options.onRecover, event.info);
      } else if (event.type === "drop") {
        this._call(this.options.onDrop, event.n, { total: this.core.dropped });
      } else if (event.type === "error") {
        this._reportError(event.error);
      } else if (event.type === "message") {
        // In order, one at a time: an async onMessage holds back the credit,
        // so a slow page slows the gateway's sending (its policy then applies).
        this._chain = this._chain.then(async () => {
          if (event.fresh) await this._call(this.options.onMessage, event.message);
          const grant = this.core.consumed(event.generation);
          if (grant > 0 && this.ws === ws && ws.readyState === OPEN) {
            ws.send(`{"op":"credit","n":${grant}}`);
          }
        });
      }
    }
  }

  opened() {
    if (this.reconnects > 0 && !this.core.position.resuming) {
      // A reconnect that could not ask to resume (the gateway never said where
      // the stream was, e.g. a v1 gateway): messages may have been missed.
      this._call(this.options.onRecover, {
        recovered: false,
        epoch: null,
        offset: null,
        since: this.core.position.offset,
      });
    }
  }
}

/**
 * The `subscribe` frame of one topic on the multiplexed socket `/ws/`, from a
 * subscription's options and its core's next parameters (credit, resume).
 */
export function subscribeFrame(topic, options, params) {
  const frame = { op: "subscribe", topic, ref: `sub:${topic}` };
  const fields = {
    capacity: options.capacity,
    on_full: options.onFull,
    priority: options.priority,
    presence: options.presence ? true : undefined,
    ...params,
  };
  for (const [key, value] of Object.entries(fields)) {
    if (value !== undefined && value !== null) frame[key] = value;
  }
  return frame;
}

/**
 * Presence frames (`presence`, `join`, `leave`) as member changes:
 * `{joins: [{client, user, info}], leaves: [{client, user}]}`.
 */
export function presenceChanges(frame) {
  if (frame.op === "presence") {
    return { joins: frame.joins || [], leaves: frame.leaves || [] };
  }
  if (frame.op === "join") {
    return { joins: [{ client: frame.client, user: frame.user, info: frame.info ?? null }], leaves: [] };
  }
  if (frame.op === "leave") {
    return { joins: [], leaves: [{ client: frame.client, user: frame.user }] };
  }
  return { joins: [], leaves: [] };
}

/**
 * One socket `/ws/` carrying the subscriptions of a client (protocol 1.2,
 * "The multiplexed socket"). It opens with the first subscription and
 * closes after the last; after a reconnect it subscribes every topic again,
 * each from its own position, so they resume together.
 */
class Multiplex extends Link {
  constructor(client) {
    super(client, {});
    this.topics = new Map(); // topic -> MuxSubscription
  }

  path() {
    return "/ws/";
  }

  add(sub) {
    this.topics.set(sub.topic, sub);
    if (this.ws && this.ws.readyState === OPEN) sub._subscribe(this.ws);
  }

  remove(sub) {
    if (this.topics.get(sub.topic) !== sub) return;
    this.topics.delete(sub.topic);
    const ws = this.ws;
    if (ws && ws.readyState === OPEN && sub.subscribedOn === ws) {
      this._request(ws, { op: "unsubscribe", topic: sub.topic }).catch(() => {});
    }
    if (this.topics.size === 0) this.close();
  }

  _setState(state, info = {}) {
    super._setState(state, info);
    for (const sub of this.topics.values()) sub._call(sub.options.onStateChange, state, info);
  }

  _reportError(err) {
    if (err && err.ref && String(err.ref).startsWith("sub:")) {
      const sub = this.topics.get(String(err.ref).slice(4));
      if (sub) {
        sub._refused(err);
        return;
      }
    }
    super._reportError(err);
  }

  opened(ws) {
    for (const sub of this.topics.values()) sub._subscribe(ws);
  }

  frame(frame, ws) {
    if (frame.op === "error" && typeof frame.ref === "string" && frame.ref.startsWith("sub:")) {
      const sub = this.topics.get(frame.ref.slice(4));
      if (sub) sub._refused(errorFromFrame(frame));
      return;
    }
    const sub = typeof frame.topic === "string" ? this.topics.get(frame.topic) : undefined;
    if (!sub) {
      if (frame.op === "error") this._reportError(errorFromFrame(frame));
      return;
    }
    sub._frame(frame, ws);
  }

  lost() {
    for (const sub of this.topics.values()) {
      sub.subscribedOn = null;
      sub._ready = false;
    }
  }

  _finish(error) {
    super._finish(error);
    for (const sub of [...this.topics.values()]) sub._ended(error);
    this.topics.clear();
    if (this.client._mux === this) this.client._mux = null;
  }
}

/**
 * A topic subscription carried by the client's one multiplexed socket: what
 * `client.subscribe(topic, options)` returns by default. The same options,
 * callbacks and resume as a subscription on a socket of its own
 * ({@link Subscription}); with `presence: true` it also keeps the topic's
 * `members` and calls `onJoin(member)` / `onLeave(member)`.
 */
export class MuxSubscription {
  constructor(client, topic, options = {}) {
    this.client = client;
    this.topic = topic;
    this.options = options;
    this.core = new SubscriberCore(topic, options);
    this.members = new Map(); // client id -> {client, user, info}
    this.closed = false;
    this.error = null;
    this.subscribedOn = null; // the socket the current subscription is on
    this._everSubscribed = false; // the gateway said `subscribed` once
    this._ready = false; // subscribed on the current socket
    this._openWaiters = [];
    this._chain = Promise.resolve();
    this.done = new Promise((resolve) => {
      this._resolveDone = resolve;
    });
  }

  /** The multiplexed socket carrying it. */
  get link() {
    return this.client._mux;
  }

  get state() {
    return this.closed ? "closed" : this.link ? this.link.state : "closed";
  }

  get reconnects() {
    return this.link ? this.link.reconnects : 0;
  }

  /** `{epoch, offset}` of the last message received (save it to resume after a reload). */
  get position() {
    return { epoch: this.core.position.epoch, offset: this.core.position.offset };
  }

  /** Messages this subscription lost to its buffer policy, as the gateway reported. */
  get dropped() {
    return this.core.dropped;
  }

  _call(callback, ...args) {
    if (!callback) return undefined;
    try {
      const result = callback(...args);
      if (result && typeof result.then === "function") {
        return result.then(undefined, (err) => this._reportError(err));
      }
      return result;
    } catch (err) {
      this._reportError(err);
      return undefined;
    }
  }

  _reportError(err) {
    const handler = this.options.onError || this.client.onError;
    if (handler) {
      try {
        handler(err);
      } catch {
        // An error handler that throws has nobody left to tell.
      }
    } else if (globalThis.console) {
      globalThis.console.error("leasecast:", err);
    }
  }

  _subscribe(ws) {
    if (this.closed) return;
    const resumed = this._everSubscribed;
    this.subscribedOn = ws;
    this._ready = false;
    const frame = subscribeFrame(this.topic, this.options, this.core.openParams());
    ws.send(JSON.stringify(frame));
    if (resumed && !this.core.position.resuming) {
      // Subscribed again without a position to resume (never told one).
      this._call(this.options.onRecover, {
        recovered: false,
        epoch: null,
        offset: null,
        since: this.core.position.offset,
      });
    }
  }

  _frame(frame, ws) {
    if (this.closed || ws !== this.subscribedOn) return;
    if (frame.op === "subscribed") {
      this._everSubscribed = true;
      this._ready = true;
      for (const waiter of this._openWaiters.splice(0)) waiter.resolve();
    }
    if (frame.op === "unsubscribed") {
      // The gateway ended it (slow consumer, the topic's offsets restarted):
      // subscribe again from the position, as a socket of its own reconnects.
      this.members.clear();
      this._subscribe(ws);
      return;
    }
    if (frame.op === "presence" || frame.op === "join" || frame.op === "leave") {
      const { joins, leaves } = presenceChanges(frame);
      for (const member of joins) {
        this.members.set(member.client, member);
        this._call(this.options.onJoin, member);
      }
      for (const member of leaves) {
        this.members.delete(member.client);
        this._call(this.options.onLeave, member);
      }
      return;
    }
    for (const event of this.core.handle(frame)) {
      if (event.type === "recover") {
        this._call(this.options.onRecover, event.info);
      } else if (event.type === "drop") {
        this._call(this.options.onDrop, event.n, { total: this.core.dropped });
      } else if (event.type === "error") {
        this._reportError(event.error);
      } else if (event.type === "message") {
        // In order, one at a time: an async onMessage holds back the credit.
        this._chain = this._chain.then(async () => {
          if (event.fresh) await this._call(this.options.onMessage, event.message);
          const grant = this.core.consumed(event.generation);
          if (grant > 0 && !this.closed && this.subscribedOn === ws && ws.readyState === OPEN) {
            ws.send(JSON.stringify({ op: "credit", topic: this.topic, n: grant }));
          }
        });
      }
    }
  }

  _refused(error) {
    // Refused by the gateway (forbidden, invalid, too many): final for this topic.
    this._reportError(error);
    this._ended(error);
    const link = this.link;
    if (link) link.remove(this);
  }

  _ended(error) {
    if (this.closed && this.error !== null) return;
    this.closed = true;
    this.error = error || null;
    const failure = this.error || new ConnectionClosed(CloseCode.NORMAL_CLOSURE, "closed");
    for (const waiter of this._openWaiters.splice(0)) waiter.reject(failure);
    this._resolveDone(this.error);
  }

  /** Resolves once the gateway has subscribed it on an open socket (`subscribed`). */
  whenOpen() {
    if (this.closed) {
      return Promise.reject(this.error || new ConnectionClosed(CloseCode.NORMAL_CLOSURE, "closed"));
    }
    const ws = this.subscribedOn;
    if (this._ready && ws && ws.readyState === OPEN) return Promise.resolve();
    return new Promise((resolve, reject) => this._openWaiters.push({ resolve, reject }));
  }

  /** Stop receiving the topic. Resolves once done. */
  close() {
    if (!this.closed) {
      const link = this.link;
      this._ended(null);
      if (link) link.remove(this);
    }
    return this.done.then(() => undefined);
  }
}

/** One leased message in a worker: settle it with ack, nack or reject (once). */
export class Delivery {
  constructor(consumer, ws, record) {
    Object.assign(this, record);
    Object.defineProperty(this, "_consumer", { value: consumer });
    Object.defineProperty(this, "_ws", { value: ws });
    this.settled = false;
  }

  _settle(frame) {
    if (this.settled) {
      return Promise.reject(new StaleReceipt("this delivery was already settled"));
    }
    this.settled = true;
    const consumer = this._consumer;
    if (consumer.ws !== this._ws) {
      // The socket that held the lease closed: the gateway released it already.
      return Promise.reject(new StaleReceipt("the socket holding this lease closed"));
    }
    return consumer._request(this._ws, { ...frame, receipt: this.receipt });
  }

  /** Delete the message; `enqueue` follow-ups are enqueued in the same transaction. */
  ack({ enqueue } = {}) {
    const frame = { op: "ack" };
    if (enqueue) {
      frame.enqueue = enqueue.map(({ queue, body, ...options }) => ({
        op: "enqueue",
        ...(queue ? { queue } : {}),
        body,
        ...enqueueFields(options),
      }));
    }
    return this._settle(frame);
  }

  /** Release it: visible again after `delay` seconds. */
  nack({ delay = 0 } = {}) {
    return this._settle({ op: "nack", delay });
  }

  /** Dead-letter it now. */
  reject() {
    return this._settle({ op: "reject" });
  }

  /** The lease now ends `timeout` seconds from now (may be called while unsettled). */
  async extend(timeout) {
    if (this.settled) throw new StaleReceipt("this delivery was already settled");
    if (this._consumer.ws !== this._ws) {
      throw new StaleReceipt("the socket holding this lease closed");
    }
    const reply = await this._consumer._request(this._ws, {
      op: "extend",
      receipt: this.receipt,
      timeout,
    });
    this.expiresIn = reply.expires_in;
    return reply.expires_in;
  }
}

/**
 * A worker: `client.consume(queue, handler, {prefetch})`. The handler gets a
 * Delivery; when it returns (or its promise resolves) the delivery is acked,
 * when it throws it is nacked (after `nackDelay` seconds), unless the handler
 * settled it itself. Reconnects with backoff; leases of a lost socket are
 * released by the gateway and delivered again.
 */
export class Consumer extends Link {
  constructor(client, queue, handler, options = {}) {
    super(client, options);
    this.queue = queue;
    this.handler = handler;
    this.options = options;
    this.active = 0;
    this.acked = 0;
    this.nacked = 0;
  }

  path() {
    return namePath("/ws/queues/", this.queue);
  }

  params() {
    return { prefetch: this.options.prefetch, visibility_timeout: this.options.visibilityTimeout };
  }

  frame(frame, ws) {
    if (frame.op === "error") {
      this._reportError(errorFromFrame(frame));
      return;
    }
    // After close(), deliveries still in flight are released with the socket.
    if (this.closed) return;
    for (const record of deliveriesOf(frame)) this._run(new Delivery(this, ws, record));
  }

  async _run(delivery) {
    this.active += 1;
    let failure = null;
    try {
      await this.handler(delivery);
    } catch (err) {
      failure = err;
    }
    this.active -= 1;
    if (delivery.settled || this.options.autoAck === false) return;
    try {
      if (failure === null) {
        await delivery.ack();
        this.acked += 1;
      } else {
        this._reportError(failure);
        const delay = this.options.nackDelay;
        await delivery.nack({
          delay: typeof delay === "function" ? delay(delivery, failure) : (delay ?? 0),
        });
        this.nacked += 1;
      }
    } catch (err) {
      this._reportError(err);
    }
  }
}

/** The producer socket behind `client.enqueue` and `client.publish`. */
export class Producer extends Link {
  path() {
    return "/ws/produce/";
  }

  frame(frame) {
    if (frame.op === "error") this._reportError(errorFromFrame(frame));
  }
}

/**
 * A connection to one gateway.
 *
 * Options:
 * - `token`: a stored token, or a signed token for a short page;
 * - `getToken`: async () => string, called for every new socket and before a
 *   signed token expires (its `exp`), when the socket is sent `refresh`;
 * - `WebSocket`: the WebSocket class (default: the global one);
 * - `backoff`: `{initial, max}` reconnect delays in ms (default 100, 5000);
 * - `refreshLead`: ms before expiry to refresh (default 30,000);
 * - `onError`: receives errors no promise returns (default: console.error).
 */
export class Leasecast {
  constructor(url, options = {}) {
    if (url && typeof url === "object" && !(url instanceof URL)) {
      options = url;
      url = undefined;
    }
    this.url = String(url ?? defaultBaseUrl());
    this.token = options.token ?? null;
    this.getToken = options.getToken ?? null;
    this.WebSocket = options.WebSocket ?? globalThis.WebSocket;
    if (!this.WebSocket) {
      throw new Invalid("no WebSocket implementation: pass options.WebSocket");
    }
    this.backoffOptions = options.backoff ?? {};
    this.refreshLead = options.refreshLead ?? 30_000;
    this.onError = options.onError ?? null;
    this._tokenObtainedAt = Date.now();
    this._tokenPromise = null;
    this._links = new Set();
    this._producer = null;
    // One multiplexed socket for this client's subscriptions (unless multiplex: false).
    this.multiplex = options.multiplex ?? true;
    this._mux = null;
  }

  /** The token for a new socket: the current one, or a new one from getToken when due. */
  async _token({ fresh = false } = {}) {
    if (!this.getToken) return this.token;
    if (!fresh && this.token !== null) {
      const delay = refreshDelay(this.token, {
        obtainedAt: this._tokenObtainedAt,
        lead: this.refreshLead,
        floor: 0,
      });
      if (delay === null || delay > 0) return this.token;
    }
    // Sockets asking together share one call.
    if (!this._tokenPromise) {
      this._tokenPromise = (async () => {
        try {
          const token = await this.getToken();
          if (typeof token !== "string" || !token) {
            throw new Unauthorized("getToken returned no token");
          }
          this.token = token.trim();
          this._tokenObtainedAt = Date.now();
          return this.token;
        } finally {
          this._tokenPromise = null;
        }
      })();
    }
    return this._tokenPromise;
  }

  _track(link) {
    this._links.add(link);
    link.done.then(() => this._links.delete(link));
    return link.start();
  }

  /**
   * Subscribe to a topic. Options: `capacity`, `onFull` ("drop_oldest",
   * "drop_newest", "block"), `priority`, `credit` (window, default 256),
   * `onMessage(message)` (may be async: credit waits for it), `onDrop(n)`,
   * `onRecover({recovered, epoch, offset, since})`, `since` and `epoch` (a
   * saved position), `recover: "latest"`, `resume` (default true),
   * `presence` (with `onJoin(member)`, `onLeave(member)`),
   * `onStateChange(state)`, `onError(error)`, `multiplex`.
   *
   * By default every subscription of this client shares one socket (`/ws/`,
   * a {@link MuxSubscription}); `multiplex: false` (here or on the client)
   * gives it a socket of its own (a {@link Subscription}). Both have
   * `close()`, `done`, `position`, `dropped` and `state`.
   */
  subscribe(topic, options = {}) {
    if (!(options.multiplex ?? this.multiplex)) {
      return this._track(new Subscription(this, topic, options));
    }
    if (this._mux && this._mux.topics.has(topic)) {
      throw new Invalid(`topic ${topic} is subscribed on this client already`);
    }
    if (!this._mux || this._mux.closed) {
      this._mux = new Multiplex(this);
      this._links.add(this._mux);
      const mux = this._mux;
      mux.done.then(() => this._links.delete(mux));
      const sub = new MuxSubscription(this, topic, options);
      mux.add(sub);
      mux.start();
      return sub;
    }
    const sub = new MuxSubscription(this, topic, options);
    this._mux.add(sub);
    return sub;
  }

  /**
   * Who is subscribed to a topic with presence, on every gateway process:
   * `GET /api/topics/TOPIC/presence` with this client's token; resolves to
   * `{topic, count, clients: [{client, user, info}]}`.
   */
  async presence(topic) {
    const token = await this._token();
    const base = this.url.replace(/^ws/, "http").replace(/\/+$/, "");
    const response = await fetch(`${base}${namePath("/api/topics/", topic)}presence`, {
      headers: token ? { Authorization: `Bearer ${token}` } : {},
    });
    const body = await response.json();
    if (!response.ok) {
      throw errorFromFrame({ op: "error", code: body.error, detail: body.detail });
    }
    return body;
  }

  /** Work a queue: `handler(delivery)`; options `prefetch`, `visibilityTimeout`, `nackDelay`, `autoAck`. */
  consume(queue, handler, options = {}) {
    return this._track(new Consumer(this, queue, handler, options));
  }

  _producerLink() {
    if (!this._producer || this._producer.closed) {
      this._producer = this._track(new Producer(this, {}));
    }
    return this._producer;
  }

  /** Enqueue a message; resolves to `{id, duplicate}`. Options: `key`, `delay`, `group`, `priority`, `ttl`. */
  async enqueue(queue, body, options = {}) {
    const reply = await this._producerLink().request({
      op: "enqueue",
      queue,
      body,
      ...enqueueFields(options),
    });
    return { id: reply.id, duplicate: Boolean(reply.duplicate) };
  }

  /** Publish to a topic; resolves to `{seq, offset, epoch}` once the gateway accepted it. */
  async publish(topic, body) {
    const reply = await this._producerLink().request({ op: "publish", topic, body });
    return { seq: reply.seq, offset: reply.offset, epoch: reply.epoch };
  }

  /** Close every socket of this client. */
  async close() {
    await Promise.all([...this._links].map((link) => link.close()));
  }
}

// ---------------------------------------------------------------- tasks

/**
 * Follow a django.tasks task run by `leasecast_worker` (docs/clients.md,
 * "Following a task"): its topic `task.RESULT_ID` carries
 * `{status: "RUNNING", progress}` updates, then `{status: "SUCCESSFUL",
 * return_value}` or `{status: "FAILED", error}`. It starts from the topic's
 * latest message (a page opened late, or reloaded, shows where the task is),
 * resumes by itself after a reconnect, and stops after the outcome.
 * Options: `onProgress(progress, update)`, `onDone(outcome)`; the others go
 * to `subscribe` (`onError`, `onStateChange`, ...). Returns the subscription
 * (`close()` it to stop watching). The token needs `subscribe:task.RESULT_ID`.
 */
export function watchTask(client, resultId, options = {}) {
  const { onProgress, onDone, ...rest } = options;
  let finished = false;
  const subscription = client.subscribe(`task.${resultId}`, {
    recover: "latest",
    ...rest,
    onMessage: async ({ body }) => {
      if (finished || !body || typeof body !== "object") return;
      if (body.status === "RUNNING") {
        await onProgress?.(body.progress, body);
      } else if (body.status === "SUCCESSFUL" || body.status === "FAILED") {
        finished = true;
        subscription.close();
        await onDone?.(body);
      }
    },
  });
  return subscription;
}

/** `client.watchTask(resultId, {onProgress, onDone})`: {@link watchTask} on this client. */
Leasecast.prototype.watchTask = function watchTaskOf(resultId, options) {
  return watchTask(this, resultId, options);
};

export default Leasecast;
