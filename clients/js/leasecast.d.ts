// TypeScript declarations of leasecast.js (the module itself is plain JavaScript).

export declare const VERSION: string;

// ---------------------------------------------------------------- errors

/** Root of every error this client raises. */
export declare class LeasecastError extends Error {}

/** An `error` frame from the gateway; `code` is its wire code. */
export declare class ProtocolError extends LeasecastError {
  static readonly code: string;
  readonly code: string;
  readonly detail: string;
  readonly ref?: string | number;
  /** Seconds until the same frame would be admitted (`backpressure` only). */
  readonly retryAfter?: number;
  readonly frame?: ErrorFrame;
  constructor(
    detail?: string,
    options?: { code?: string; ref?: string | number; retryAfter?: number; frame?: ErrorFrame },
  );
}
export declare class BadFrame extends ProtocolError {}
export declare class UnknownOp extends ProtocolError {}
export declare class Invalid extends ProtocolError {}
export declare class TooLarge extends ProtocolError {}
export declare class Unauthorized extends ProtocolError {}
export declare class Forbidden extends ProtocolError {}
export declare class StaleReceipt extends ProtocolError {}
export declare class NotFound extends ProtocolError {}
export declare class Backpressure extends ProtocolError {}
export declare class Unavailable extends ProtocolError {}

/** The WebSocket close codes of the gateway (docs/protocol.md, Errors), as in the Python client. */
export declare const CloseCode: {
  readonly NORMAL_CLOSURE: 1000;
  readonly GOING_AWAY: 1001;
  readonly ABNORMAL_CLOSURE: 1006;
  readonly MESSAGE_TOO_BIG: 1009;
  readonly DISCONNECTED_BY_OPERATOR: 4000;
  readonly SLOW_CONSUMER: 4008;
  readonly INVALID: 4400;
  readonly UNAUTHORIZED: 4401;
  readonly FORBIDDEN: 4403;
  readonly STREAM_RESTARTED: 4409;
  readonly TOO_MANY_SOCKETS: 4429;
  readonly UNAVAILABLE: 4503;
};

/** The socket closed (or never opened). */
export declare class ConnectionClosed extends LeasecastError {
  readonly code: number;
  readonly reason: string;
  constructor(code?: number, reason?: string);
}

export interface ErrorFrame {
  op: "error";
  code: string;
  detail?: string;
  ref?: string | number;
  retry_after?: number;
}

/** Any frame: a JSON object with a string `op`. */
export interface Frame {
  op: string;
  ref?: string | number;
  [field: string]: unknown;
}

export declare function errorFromFrame(frame: ErrorFrame | Frame): ProtocolError;

// ---------------------------------------------------------------- values

/** One broadcast message handed to `onMessage`. */
export interface Message<T = unknown> {
  readonly topic: string;
  /** Per socket: restarts at 1 with each new socket; a gap is where drops were. */
  readonly seq: number;
  /** Per topic (gateway 1.1): strictly increasing, stable across reconnects. */
  readonly offset?: number;
  readonly body: T;
}

/** What a resume after a reconnect (or from a saved position) achieved. */
export interface RecoverInfo {
  /** False: messages after `since` were lost; only live messages follow. */
  recovered: boolean;
  epoch: string | null;
  /** The topic's latest offset when the socket subscribed. */
  offset: number | null;
  /** The offset the subscription asked to resume after. */
  since: number | null;
}

export interface Position {
  epoch: string | null;
  offset: number | null;
}

export type LinkState = "idle" | "connecting" | "open" | "reconnecting" | "closed";

export interface LinkOptions {
  onError?: (error: Error) => void;
  onStateChange?: (
    state: LinkState,
    info: { code?: number; reason?: string; delay?: number; error?: Error },
  ) => void;
}

export interface SubscribeOptions<T = unknown> extends LinkOptions {
  /** The socket's buffer in the gateway, 1..1,000,000 (default 1024). */
  capacity?: number;
  /** The gateway's policy when that buffer is full (default "drop_oldest"). */
  onFull?: "drop_oldest" | "drop_newest" | "block";
  /** Share of the gateway's send capacity under contention, 1..1000. */
  priority?: number;
  /** The credit window: messages in flight to the page (default 256). */
  credit?: number;
  /** Called in order; if it returns a promise, credit waits for it. */
  onMessage?: (message: Message<T>) => void | Promise<void>;
  /** `n` messages lost to the buffer policy (`total` so far). */
  onDrop?: (n: number, info: { total: number }) => void;
  /** After every resume attempt; `recovered: false` means a gap. */
  onRecover?: (info: RecoverInfo) => void;
  /** A saved position to resume from (both or neither). */
  since?: number;
  epoch?: string;
  /** Cache mode: hand the topic's latest message to the page first. */
  recover?: "latest";
  /** Track the position and resume after reconnects (default true). */
  resume?: boolean;
  /** Presence (the topic's setting must be on): keep `members`, call onJoin/onLeave. */
  presence?: boolean;
  /** Another subscription of the topic arrived (with presence). */
  onJoin?: (member: Member) => void;
  /** Another subscription of the topic went (with presence). */
  onLeave?: (member: Member) => void;
  /** Share the client's one socket `/ws/` (default: the client's `multiplex`, true). */
  multiplex?: boolean;
}

/** A member of a topic's presence: one subscription, on any gateway process. */
export interface Member {
  /** Unique per subscription. */
  client: string;
  /** The signed token's `sub`, the stored token's name, or the user's username. */
  user: string;
  /** The signed token's `info` claim (a leave carries none). */
  info?: Record<string, unknown> | null;
}

/** `GET /api/topics/TOPIC/presence`. */
export interface PresenceDocument {
  topic: string;
  count: number;
  clients: Member[];
}

export interface WorkOptions extends LinkOptions {
  /** Max unacked deliveries on the socket, 1..1000 (default 10). */
  prefetch?: number;
  /** Seconds of each lease (default: the queue's). */
  visibilityTimeout?: number;
  /** Delay in seconds of the automatic nack when the handler throws. */
  nackDelay?: number | ((delivery: Delivery, error: unknown) => number);
  /** Ack on return and nack on throw (default true); false: the handler settles. */
  autoAck?: boolean;
}

export interface EnqueueOptions {
  key?: string;
  delay?: number;
  group?: string;
  priority?: number;
  ttl?: number;
}

export interface FollowUp extends EnqueueOptions {
  /** Default: the delivery's own queue. */
  queue?: string;
  body: unknown;
}

export interface ClientOptions {
  /** A stored token, or a signed token. Omit for a staff user's session cookie. */
  token?: string;
  /** Called for each new socket's token and before a signed token's `exp`. */
  getToken?: () => string | Promise<string>;
  /** The WebSocket class (default: globalThis.WebSocket). */
  WebSocket?: typeof WebSocket;
  /** Reconnect delays in ms: the first ceiling and the cap (default 100, 5000). */
  backoff?: { initial?: number; max?: number; random?: () => number };
  /** Milliseconds before expiry to refresh a signed token (default 30,000). */
  refreshLead?: number;
  /** Errors no promise returns (default: console.error). */
  onError?: (error: Error) => void;
  /** Subscriptions share one socket `/ws/` (default true); false: a socket each. */
  multiplex?: boolean;
}

// ---------------------------------------------------------------- sockets

declare class Link {
  readonly state: LinkState;
  readonly reconnects: number;
  readonly closed: boolean;
  /** The final error once stopped (4403, 4400, 4401 without getToken), else null. */
  readonly error: Error | null;
  /** Resolves when the link has stopped for good (with its final error, or null). */
  readonly done: Promise<Error | null>;
  /** Resolves once a socket is open. */
  whenOpen(): Promise<void>;
  /** Send a frame with a fresh ref; resolves to the reply, rejects with a typed error. */
  request(frame: Frame): Promise<Frame>;
  close(): Promise<void>;
}

export declare class Subscription<T = unknown> extends Link {
  readonly topic: string;
  /** The last message received: save it to resume after a reload. */
  readonly position: Position;
  /** Messages lost to the buffer policy, as the gateway reported. */
  readonly dropped: number;
}

/**
 * A subscription carried by the client's one multiplexed socket `/ws/` (what
 * `subscribe` returns by default): the same callbacks and resume as a
 * {@link Subscription}; after a reconnect every topic resumes together.
 */
export declare class MuxSubscription<T = unknown> {
  readonly topic: string;
  readonly state: LinkState;
  readonly reconnects: number;
  readonly closed: boolean;
  /** Why the gateway refused it (forbidden, invalid), else null. */
  readonly error: Error | null;
  readonly done: Promise<Error | null>;
  readonly position: Position;
  readonly dropped: number;
  /** The topic's members by client id (with `presence: true`). */
  readonly members: Map<string, Member>;
  /** Resolves once the gateway has subscribed it on an open socket; rejects once it ended. */
  whenOpen(): Promise<void>;
  close(): Promise<void>;
}

/** The `subscribe` frame of `/ws/` for a topic, its options and its next parameters. */
export declare function subscribeFrame(
  topic: string,
  options: SubscribeOptions,
  params: Record<string, unknown>,
): Frame;

/** A `presence`, `join` or `leave` frame as member changes. */
export declare function presenceChanges(frame: Frame): { joins: Member[]; leaves: Member[] };

export declare class Delivery<T = unknown> {
  readonly queue: string;
  readonly id: string;
  readonly receipt: string;
  readonly body: T;
  readonly deliveries: number;
  expiresIn: number;
  readonly group?: string;
  readonly priority?: number;
  readonly settled: boolean;
  ack(options?: { enqueue?: FollowUp[] }): Promise<Frame>;
  nack(options?: { delay?: number }): Promise<Frame>;
  reject(): Promise<Frame>;
  /** Resolves to the lease's new `expires_in`. */
  extend(timeout: number): Promise<number>;
}

export declare class Consumer<T = unknown> extends Link {
  readonly queue: string;
  readonly active: number;
  readonly acked: number;
  readonly nacked: number;
}

export declare class Producer extends Link {}

export declare class Leasecast {
  /** `url` defaults to the page's origin. */
  constructor(url?: string | URL, options?: ClientOptions);
  constructor(options: ClientOptions);
  readonly url: string;
  /** One socket `/ws/` for all (a MuxSubscription), or `multiplex: false`: a socket each. */
  subscribe<T = unknown>(
    topic: string,
    options?: SubscribeOptions<T>,
  ): MuxSubscription<T> | Subscription<T>;
  /** Who is subscribed to a topic with presence, on every gateway process. */
  presence(topic: string): Promise<PresenceDocument>;
  consume<T = unknown>(
    queue: string,
    handler: (delivery: Delivery<T>) => unknown | Promise<unknown>,
    options?: WorkOptions,
  ): Consumer<T>;
  enqueue(
    queue: string,
    body: unknown,
    options?: EnqueueOptions,
  ): Promise<{ id: string; duplicate: boolean }>;
  publish(
    topic: string,
    body: unknown,
  ): Promise<{ seq: number; offset?: number; epoch?: string }>;
  close(): Promise<void>;
}
export default Leasecast;

// ---------------------------------------------------------------- tasks

/** What a task's topic `task.RESULT_ID` carries (docs/clients.md, "Following a task"). */
export interface TaskUpdate {
  status: "RUNNING" | "SUCCESSFUL" | "FAILED";
  /** RUNNING: what the task passed to `gateway.tasks.progress()`. */
  progress?: unknown;
  /** SUCCESSFUL: what the task returned. */
  return_value?: unknown;
  /** FAILED: "module.Class: message" (`leasecast.errors.Cancelled: ...` if cancelled). */
  error?: string;
}

export interface WatchTaskOptions extends Omit<SubscribeOptions<TaskUpdate>, "onMessage"> {
  onProgress?: (progress: unknown, update: TaskUpdate) => void | Promise<void>;
  /** The outcome (SUCCESSFUL or FAILED); the subscription is closed then. */
  onDone?: (outcome: TaskUpdate) => void | Promise<void>;
}

/** Follow a task: its latest update first, then each one, resuming by itself. */
export declare function watchTask(
  client: Leasecast,
  resultId: string,
  options?: WatchTaskOptions,
): Subscription<TaskUpdate>;

export declare interface Leasecast {
  /** {@link watchTask} on this client. */
  watchTask(resultId: string, options?: WatchTaskOptions): Subscription<TaskUpdate>;
}

// ---------------------------------------------------------------- pure parts

export declare function parseFrame(data: unknown): Frame;
export declare function buildUrl(
  base: string | URL,
  path: string,
  params?: Record<string, string | number | undefined | null>,
): string;
export declare function namePath(prefix: string, name: string): string;

export declare class CreditWindow {
  readonly window: number;
  consumed: number;
  constructor(window?: number);
  consume(n?: number): number;
  reset(): void;
}

export declare class Backoff {
  constructor(options?: { initial?: number; max?: number; random?: () => number });
  next(): number;
  reset(): void;
}

export declare class ResumePosition {
  epoch: string | null;
  offset: number | null;
  constructor(options?: { since?: number; epoch?: string; latest?: boolean; resume?: boolean });
  readonly known: boolean;
  readonly resuming: boolean;
  params(): { since?: number; epoch?: string; recover?: "latest" };
  subscribed(frame: Frame): RecoverInfo;
  accept(item: { offset?: number }): boolean;
}

export type SubscriberEvent =
  | { type: "recover"; info: RecoverInfo }
  | { type: "drop"; n: number }
  | { type: "message"; message: Message; generation: number; fresh: boolean }
  | { type: "error"; error: ProtocolError };

export declare class SubscriberCore {
  readonly topic: string;
  readonly credit: CreditWindow;
  readonly position: ResumePosition;
  readonly dropped: number;
  constructor(
    topic: string,
    options?: Pick<SubscribeOptions, "credit" | "since" | "epoch" | "recover" | "resume">,
  );
  openParams(): Record<string, string | number>;
  handle(frame: Frame): SubscriberEvent[];
  consumed(generation: number): number;
}

export declare class PendingReplies {
  readonly size: number;
  constructor(prefix?: string);
  add(): { ref: string; promise: Promise<Frame> };
  settle(frame: Frame): boolean;
  failAll(error: Error): void;
}

export declare function decodeJwtPayload(token: string | null | undefined): Record<
  string,
  unknown
> | null;
export declare function refreshDelay(
  token: string | null | undefined,
  options?: { obtainedAt?: number; now?: number; lead?: number; floor?: number },
): number | null;
export declare function closeAction(
  code: number,
  options?: { canRenewToken?: boolean },
): "stop" | "token" | "retry";
export declare function closeError(code: number, reason: string, lastError?: Error | null): Error;
/** A socket closed 4401 right after its only frame, an `unauthorized` error: its token was refused. */
export declare function refusedAtOpen(
  code: number,
  frames: Array<{ op: string; code?: unknown }>,
): boolean;
export declare function deliveriesOf(frame: Frame): Array<{
  queue: string;
  id: string;
  receipt: string;
  body: unknown;
  deliveries: number;
  expiresIn: number;
  group?: string;
  priority?: number;
}>;
export declare function enqueueFields(options?: EnqueueOptions): EnqueueOptions;
