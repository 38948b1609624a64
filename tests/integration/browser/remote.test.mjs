// The Remote JS client (plugins/browser/ui/remote.js) in Chromium against the real host (PROTOCOLS.md
// REMOTE-CLIENT-MOUNT, REMOTE-CLIENT-INVOKE, REMOTE-EVENT-ALLOWLIST / FORWARD). playwright-core drives
// Debian's Chromium (headless); `agenthost serve` runs with the browser and remote plugins, and the fixture
// plugin remote-types (namespace `types`, descriptors of every type, the cancellable `types.slow`) is loaded
// into it at runtime. Pages sit at the host's origin and import remote.js from the host's static route; their
// transport is remote-page.mjs (POST /api/* with the bearer, the host stream for events).
//
// One host and one browser for the file; each test mounts what it needs and withdraws it again:
//   1. describe → mount → every type round-trips; withdraw removes the services;
//   2. the strict codec refuses a malformed set whole, before anything is published;
//   3. duplicates (descriptor, namespace of another mount, service name taken) are refused up front;
//   4. an install failing part-way rolls back in reverse order and leaves no method;
//   5. withdraw aborts an in-flight `types.slow(20000)` → cancelled at once; the caller's own signal too;
//   6. error folding: bad-request (client side without a request, and from the host naming the field),
//      not-found, internal (also a malformed reply), every category a service reports, forbidden for a LAN
//      peer (and the loopback caller's privilege), unavailable after `agenthost plugins unload`;
//   7. no connection → the call throws;
//   8. events: session.created arrives as a host/remote-event; ok.ping (a plugin's own allowlisted event)
//      and session.delta do not; the client drops malformed and unlisted frames with a warning.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { chromium } from "playwright-core";
import { chromiumPath, sleep, waitFor } from "./lib.mjs";
import { RemoteHost, openHarness, inPage } from "./remote-harness.mjs";

const TEST = { timeout: 60000 };
const CHROMIUM = chromiumPath();
const skip = CHROMIUM ? false : "no Chromium (apt-get install chromium, or set AH_TEST_CHROMIUM)";

const ctx = { host: null, browser: null, context: null, page: null };

before(async () => {
  if (skip) return;
  // The LAN listener (for `forbidden`) can be turned off with AH_TEST_NO_LAN=1.
  ctx.host = await new RemoteHost().start({ lan: !process.env.AH_TEST_NO_LAN });
  await ctx.host.loadPlugin("remote-types");
  ctx.browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  ctx.context = await ctx.browser.newContext();
  ctx.page = await openHarness(ctx.context, ctx.host.origin, ctx.host.token);
});

after(async () => {
  await ctx.context?.close().catch(() => {});
  await ctx.browser?.close().catch(() => {});
  await ctx.host?.stop();
});

const failMessage = () => `host log:\n${ctx.host?.tail()}\npage console:\n${ctx.page?.consoleLines.slice(-20).join("\n")}`;

test("describe → mount: every type round-trips through the real host; withdraw removes the services", { ...TEST, skip }, async () => {
  const r = await inPage(ctx.page, async (t) => {
    const set = await t.client.describe();
    const mount = t.client.mount(set);
    const s = t.client.services;
    const out = {
      namespaces: Object.keys(s).sort(),
      frozen: Object.isFrozen(s.types),
      methods: Object.keys(s.types).sort(),
      descriptor: s.types.echo_int.descriptor,
      calls: {
        bool: await s.types.echo_bool(true),
        int: await s.types.echo_int(-9007199254740991),
        double: await s.types.echo_double(0.25),
        string: await s.types.echo_string("héllo ✓"),
        json: await s.types.echo_json({ a: [1, "x", null, { b: false }] }),
        nothing: await s.types.nothing(),
        optionalsNone: await s.types.optionals(),
        optionalsSome: await s.types.optionals(true, undefined, 1.5, null, ["j"]),
        maybeNull: await s.types.maybe_string(false),
        maybeGiven: await s.types.maybe_string(true),
        viaInvoke: await mount.invoke("types", "echo_int", [7]),
      },
    };
    await mount.withdraw();
    out.after = { namespaces: Object.keys(s), active: mount.active, mounts: t.client.mounts.size };
    return out;
  });
  assert.deepEqual(r.namespaces, ["sessions", "types"], failMessage());
  assert.equal(r.frozen, true);
  assert.ok(r.methods.includes("slow") && r.methods.includes("admin") && r.methods.includes("echo_json"));
  assert.deepEqual(r.descriptor, {
    namespace: "types",
    method: "echo_int",
    params: [{ name: "i", type: "int64", optional: false }],
    result: "int64",
    resultOptional: false,
    cancellable: false,
    lookup: "none",
    privileged: false,
    plugin: "remote-types",
  });
  assert.deepEqual(r.calls, {
    bool: { ok: true, value: true },
    int: { ok: true, value: -9007199254740991 },
    double: { ok: true, value: 0.25 },
    string: { ok: true, value: "héllo ✓" },
    json: { ok: true, value: { a: [1, "x", null, { b: false }] } },
    nothing: { ok: true, value: null },
    optionalsNone: { ok: true, value: { b: "absent", i: "absent", d: "absent", s: "absent", j: "absent" } },
    optionalsSome: { ok: true, value: { b: true, i: "absent", d: 1.5, s: "absent", j: ["j"] } },
    maybeNull: { ok: true, value: null },
    maybeGiven: { ok: true, value: "given" },
    viaInvoke: { ok: true, value: 7 },
  });
  assert.deepEqual(r.after, { namespaces: [], active: false, mounts: 0 });
});

test("the strict codec refuses a malformed set as a whole, before anything is published", { ...TEST, skip }, async () => {
  const r = await inPage(ctx.page, async (t) => {
    const set = await t.client.describe();
    const good = set.find((d) => d.namespace === "types" && d.method === "rename");
    const clone = () => JSON.parse(JSON.stringify(good));
    const bad = {
      unknownField: { ...clone(), extra: 1 },
      missingField: (() => {
        const d = clone();
        delete d.cancellable;
        return d;
      })(),
      badType: (() => {
        const d = clone();
        d.params[1].type = "float";
        return d;
      })(),
      badNamespace: { ...clone(), namespace: "Types" },
      badMethod: { ...clone(), method: "re-name" },
      sessionNotFirst: (() => {
        const d = clone();
        d.params.reverse();
        return d;
      })(),
      lookupMismatch: { ...clone(), lookup: "agent" },
      optionalBool: { ...clone(), result: "bool", resultOptional: true },
      sessionResult: { ...clone(), result: "session" },
      flagNotBool: { ...clone(), cancellable: 1 },
      duplicateParam: (() => {
        const d = clone();
        d.params[1].name = "session";
        return d;
      })(),
    };
    const out = {};
    for (const [k, d] of Object.entries(bad)) {
      // A good descriptor of another namespace first: it must not be published either.
      const other = { ...clone(), namespace: "early" };
      try {
        t.client.mount({ descriptors: [other, d] });
        out[k] = "mounted";
      } catch (e) {
        out[k] = { name: e.name, code: e.code, path: e.path };
      }
    }
    for (const [k, v] of [
      ["notASet", 42],
      ["setExtraKey", { descriptors: [], more: true }],
      ["notAnArray", { descriptors: {} }],
    ]) {
      try {
        t.client.mount(v);
        out[k] = "mounted";
      } catch (e) {
        out[k] = { name: e.name, code: e.code, path: e.path };
      }
    }
    out.published = Object.keys(t.client.services);
    out.mounts = t.client.mounts.size;
    return out;
  });
  const want = (path) => ({ name: "RemoteMountError", code: "invalid-descriptor", path });
  assert.deepEqual(r.unknownField, want("descriptors[1].extra"));
  assert.deepEqual(r.missingField, want("descriptors[1].cancellable"));
  assert.deepEqual(r.badType, want("descriptors[1].params[1].type"));
  assert.deepEqual(r.badNamespace, want("descriptors[1].namespace"));
  assert.deepEqual(r.badMethod, want("descriptors[1].method"));
  assert.deepEqual(r.sessionNotFirst, want("descriptors[1].params[1].type"));
  assert.deepEqual(r.lookupMismatch, want("descriptors[1].params[0].type"));
  assert.deepEqual(r.optionalBool, want("descriptors[1].resultOptional"));
  assert.deepEqual(r.sessionResult, want("descriptors[1].result"));
  assert.deepEqual(r.flagNotBool, want("descriptors[1].cancellable"));
  assert.deepEqual(r.duplicateParam, want("descriptors[1].params[1].name"));
  assert.deepEqual(r.notASet, want("descriptorSet"));
  assert.deepEqual(r.setExtraKey, want("descriptorSet.more"));
  assert.deepEqual(r.notAnArray, want("descriptorSet.descriptors"));
  assert.deepEqual(r.published, []);
  assert.equal(r.mounts, 0);
});

test("duplicates are refused before publishing: a descriptor twice, a namespace of another mount, a taken service name", { ...TEST, skip }, async () => {
  const r = await inPage(ctx.page, async (t) => {
    const set = await t.client.describe();
    const types = set.filter((d) => d.namespace === "types");
    const sessions = set.filter((d) => d.namespace === "sessions");
    const attempt = (client, s) => {
      try {
        client.mount(s);
        return "mounted";
      } catch (e) {
        return { code: e.code, path: e.path, message: e.message };
      }
    };
    const out = {};
    // sessions first, then types with echo_int twice: nothing at all is published.
    out.duplicate = attempt(t.client, [...sessions, ...types, types.find((d) => d.method === "echo_int")]);
    out.afterDuplicate = Object.keys(t.client.services);
    // A mount holding `types`; a second set holding `sessions` and `types` is refused whole.
    const first = t.client.mount(types);
    out.namespace = attempt(t.client, [...sessions, ...types]);
    out.afterNamespace = Object.keys(t.client.services).sort();
    out.firstStillWorks = await t.client.services.types.echo_int(3);
    await first.withdraw();
    // A services object that already has `sessions` (not from a mount), or a prototype with `constructor`.
    const taken = new t.RemoteClient(t.transport, { target: { sessions: "mine" } });
    out.serviceTaken = attempt(taken, [...types, ...sessions]);
    out.takenTarget = { ...taken.services };
    const proto = new t.RemoteClient(t.transport, { target: {} });
    out.inherited = attempt(proto, [{ ...types[0], namespace: "constructor" }]);
    out.reserved = attempt(t.client, [{ ...types[0], namespace: "then" }]);
    out.final = Object.keys(t.client.services);
    return out;
  });
  assert.equal(r.duplicate.code, "duplicate-descriptor");
  assert.match(r.duplicate.message, /types\.echo_int appears twice/);
  assert.deepEqual(r.afterDuplicate, []);
  assert.equal(r.namespace.code, "namespace-taken");
  assert.equal(r.namespace.path, "types");
  assert.deepEqual(r.afterNamespace, ["types"]);
  assert.deepEqual(r.firstStillWorks, { ok: true, value: 3 });
  assert.equal(r.serviceTaken.code, "service-taken");
  assert.equal(r.serviceTaken.path, "sessions");
  assert.deepEqual(r.takenTarget, { sessions: "mine" });
  assert.equal(r.inherited.code, "service-taken");
  assert.equal(r.reserved.code, "service-taken");
  assert.deepEqual(r.final, []);
});

test("an install failing part-way is rolled back in reverse order and leaves no method", { ...TEST, skip }, async () => {
  const r = await inPage(ctx.page, async (t) => {
    const set = await t.client.describe();
    const d = set.find((x) => x.namespace === "types" && x.method === "echo_int");
    const ns = ["alpha", "beta", "gamma", "delta"];
    const descriptors = ns.map((n) => ({ ...d, namespace: n }));
    const journal = [];
    const store = {};
    let failOn = "gamma";
    // Keeps a method of `alpha` as the install published it: after the rollback it must not reach the host.
    let kept = null;
    const target = new Proxy(store, {
      defineProperty(o, k, desc) {
        journal.push(`define ${String(k)}`);
        if (k === failOn) throw new Error(`no room for ${k}`);
        if (k === "alpha") kept = desc.value.echo_int;
        return Reflect.defineProperty(o, k, desc);
      },
      deleteProperty(o, k) {
        journal.push(`delete ${String(k)}`);
        return Reflect.deleteProperty(o, k);
      },
    });
    const client = new t.RemoteClient(t.transport, { target });
    const out = {};
    try {
      client.mount(descriptors);
      out.error = "mounted";
    } catch (e) {
      out.error = { name: e.name, code: e.code, message: e.message, cause: e.cause?.message };
    }
    out.journal = [...journal];
    out.left = Object.keys(store);
    out.mounts = client.mounts.size;
    const posts = t.transport.posts.length;
    out.keptCall = kept ? await kept(1) : "no method kept";
    out.keptPosted = t.transport.posts.length - posts;
    // The namespaces were released: the same set mounts once nothing fails.
    failOn = null;
    const m = client.mount(descriptors);
    out.remounted = Object.keys(store).sort();
    journal.length = 0;
    out.call = await client.services.delta.echo_int(5);
    await m.withdraw();
    out.withdrawJournal = [...journal];
    out.finallyLeft = Object.keys(store);
    return out;
  });
  assert.equal(r.error.name, "RemoteMountError");
  assert.equal(r.error.code, "install-failed");
  assert.equal(r.error.cause, "no room for gamma");
  assert.match(r.error.message, /2 namespace\(s\) rolled back/);
  assert.deepEqual(r.journal, ["define alpha", "define beta", "define gamma", "delete beta", "delete alpha"]);
  assert.deepEqual(r.left, []);
  assert.equal(r.mounts, 0);
  assert.equal(r.keptCall.ok, false);
  assert.equal(r.keptCall.error.category, "unavailable");
  assert.equal(r.keptPosted, 0, "a rolled-back method sends nothing");
  assert.deepEqual(r.remounted, ["alpha", "beta", "delta", "gamma"]);
  // `delta` is not a namespace of the host: the call reaches it and is not-found there.
  assert.equal(r.call.ok, false);
  assert.equal(r.call.error.category, "not-found");
  assert.deepEqual(r.withdrawJournal, ["delete delta", "delete gamma", "delete beta", "delete alpha"]);
  assert.deepEqual(r.finallyLeft, []);
});

test("withdraw aborts an in-flight call (types.slow 20000 → cancelled at once); the caller's signal too", { ...TEST, skip }, async () => {
  const r = await inPage(ctx.page, async (t) => {
    const mount = t.client.mount(await t.client.describe());
    const out = {};
    const slow = t.client.services.types.slow;
    const started = performance.now();
    const p = slow(20000);
    await new Promise((res) => setTimeout(res, 300));
    out.pendingBefore = mount.pending;
    const w0 = performance.now();
    const settled = mount.withdraw();
    out.result = await p;
    out.resolvedAfterMs = performance.now() - w0;
    await settled;
    out.pendingAfter = mount.pending;
    out.totalMs = performance.now() - started;
    out.servicesAfter = Object.keys(t.client.services);
    out.mountSignal = mount.signal.aborted;
    // A method kept past withdraw answers without a request.
    const posts = t.transport.posts.length;
    out.kept = await slow(1);
    out.keptPosted = t.transport.posts.length - posts;

    // The caller's own signal, merged with the (new) mount's lifetime.
    const m2 = t.client.mount(await t.client.describe());
    const ac = new AbortController();
    const q = t.client.services.types.slow(20000, { signal: ac.signal });
    await new Promise((res) => setTimeout(res, 200));
    const a0 = performance.now();
    ac.abort();
    out.callerAbort = await q;
    out.callerAbortMs = performance.now() - a0;
    out.m2Active = m2.active;
    // Already aborted: nothing is sent.
    const before = t.transport.posts.length;
    out.preAborted = await t.client.services.types.echo_int(1, { signal: AbortSignal.abort() });
    out.preAbortedPosted = t.transport.posts.length - before;
    // The host really stopped the slow call: a short slow call completes normally afterwards.
    out.afterwards = await t.client.services.types.slow(10);
    await m2.withdraw();

    // The fallback merge (no AbortSignal.any) behaves the same and lets go of its listeners.
    const a = new AbortController();
    const b = new AbortController();
    const merged = t.mergeSignals([a.signal, b.signal], { useAny: false });
    b.abort("b went");
    out.fallback = { aborted: merged.signal.aborted, reason: merged.signal.reason };
    const c = new AbortController();
    const merged2 = t.mergeSignals([c.signal, new AbortController().signal], { useAny: false });
    merged2.dispose();
    c.abort();
    out.fallbackDisposed = merged2.signal.aborted;
    return out;
  });
  assert.equal(r.pendingBefore, 1);
  assert.equal(r.result.ok, false);
  assert.equal(r.result.error.category, "cancelled");
  assert.match(r.result.error.message, /withdrawn/);
  assert.ok(r.resolvedAfterMs < 1000, `resolved ${r.resolvedAfterMs} ms after withdraw`);
  assert.ok(r.totalMs < 5000);
  assert.equal(r.pendingAfter, 0);
  assert.deepEqual(r.servicesAfter, []);
  assert.equal(r.mountSignal, true);
  assert.equal(r.kept.error.category, "unavailable");
  assert.equal(r.keptPosted, 0);
  assert.equal(r.callerAbort.error.category, "cancelled");
  assert.match(r.callerAbort.error.message, /aborted/);
  assert.ok(r.callerAbortMs < 1000);
  assert.equal(r.m2Active, true, "the caller's abort does not end the mount");
  assert.equal(r.preAborted.error.category, "cancelled");
  assert.equal(r.preAbortedPosted, 0);
  assert.deepEqual(r.afterwards, { ok: true, value: true });
  assert.deepEqual(r.fallback, { aborted: true, reason: "b went" });
  assert.equal(r.fallbackDisposed, false);
});

test("error folding: bad-request, not-found, internal, malformed replies and every category a service reports", { ...TEST, skip }, async () => {
  const r = await inPage(ctx.page, async (t) => {
    const mount = t.client.mount(await t.client.describe());
    const s = t.client.services.types;
    const out = { client: {}, host: {} };
    const posts = t.transport.posts.length;
    // Refused in the client, without a request.
    out.client.wrongType = await s.echo_int("3");
    out.client.fraction = await s.echo_int(1.5);
    out.client.missing = await s.echo_bool();
    out.client.nul = await s.echo_string("a\u0000b");
    out.client.surrogate = await s.echo_string("\ud800");
    out.client.nan = await s.echo_double(NaN);
    out.client.jsonFn = await s.echo_json({ f: () => 1 });
    out.client.jsonDate = await s.echo_json({ when: new Date(0) });
    out.client.arity = await s.echo_int(1, {}, 3);
    out.client.badOptions = await s.echo_int(1, { timeout: 5 });
    out.client.emptySession = await s.title("");
    out.client.posted = t.transport.posts.length - posts;

    // From the host.
    out.host.unknownSession = await s.title("00000000-0000-7000-8000-000000000000");
    out.host.internalData = await s.fail(-2);
    out.host.badUtf8 = await s.bad_utf8();
    out.host.nan = await s.nan();
    out.host.categories = {};
    // AH_EINVAL, AH_ENOENT, AH_EUNAVAILABLE, AH_ECANCELED, AH_EAGENTBUSY, AH_EPERM (plugin-api errors.h).
    for (const code of [-1, -5, -7, -8, -10, -11]) out.host.categories[code] = (await s.fail(code)).error.category;

    // Descriptors that disagree with the host: the host names the field; a reply of the wrong type is
    // malformed for the client; a namespace the host lacks is not-found.
    const d = mount.descriptors.find((x) => x.namespace === "types" && x.method === "echo_int");
    const other = new t.RemoteClient(t.transport);
    const m2 = other.mount([
      { ...d, params: [{ name: "n", type: "int64", optional: false }] },
      { ...d, method: "echo_string", params: [{ name: "s", type: "string", optional: false }], result: "int64" },
      { ...d, namespace: "ghost", method: "nothing", params: [], result: "void" },
    ]);
    out.host.extraField = await other.services.types.echo_int(1);
    out.host.malformed = await other.services.types.echo_string("x");
    out.host.ghost = await other.services.ghost.nothing();
    await m2.withdraw();
    await mount.withdraw();
    return out;
  });
  const badRequest = (v, re) => {
    assert.equal(v.ok, false, JSON.stringify(v));
    assert.equal(v.error.category, "bad-request");
    assert.match(v.error.message, re);
  };
  badRequest(r.client.wrongType, /^args\.i: expected an integer/);
  badRequest(r.client.fraction, /^args\.i: /);
  badRequest(r.client.missing, /^args\.b: missing \(bool\)/);
  badRequest(r.client.nul, /^args\.s: expected a string without NUL/);
  badRequest(r.client.surrogate, /^args\.s: /);
  badRequest(r.client.nan, /^args\.d: expected a finite number/);
  badRequest(r.client.jsonFn, /^args\.j\.f: a function is not JSON/);
  badRequest(r.client.jsonDate, /^args\.j\.when: a Date object is not JSON/);
  badRequest(r.client.arity, /types\.echo_int: takes 1 argument and options, got 3/);
  badRequest(r.client.badOptions, /must be the options \{signal\}/);
  badRequest(r.client.emptySession, /^args\.session: expected a session id/);
  assert.equal(r.client.posted, 0, "nothing refused by the client was sent");

  assert.equal(r.host.unknownSession.error.category, "not-found");
  assert.equal(r.host.internalData.error.category, "internal");
  assert.equal(typeof r.host.internalData.error.data?.correlationId, "string");
  assert.equal(r.host.badUtf8.error.category, "internal");
  assert.equal(r.host.nan.error.category, "internal");
  assert.deepEqual(r.host.categories, {
    "-1": "bad-request",
    "-5": "not-found",
    "-7": "unavailable",
    "-8": "cancelled",
    "-10": "agent-busy",
    "-11": "forbidden",
  });
  badRequest(r.host.extraField, /args\.n: types\.echo_int has no such parameter/);
  assert.equal(r.host.malformed.error.category, "internal");
  assert.match(r.host.malformed.error.message, /types\.echo_string: malformed reply: expected an integer/);
  assert.equal(r.host.ghost.error.category, "not-found");
});

test("privileged descriptors: allowed for the loopback caller, forbidden for a LAN peer", { ...TEST, skip }, async (t) => {
  const admin = async (page) =>
    inPage(page, async (rt) => {
      const m = rt.client.mount((await rt.client.describe()).filter((d) => d.namespace === "types"));
      const r = await rt.client.services.types.admin();
      const plain = await rt.client.services.types.echo_int(2);
      await m.withdraw();
      return { r, plain };
    });
  assert.deepEqual((await admin(ctx.page)).r, { ok: true, value: true });
  if (!ctx.host.lanOrigin) {
    t.skip("no non-loopback IPv4 address on this machine (or AH_TEST_NO_LAN is set)");
    return;
  }
  const lan = await openHarness(ctx.context, ctx.host.lanOrigin, ctx.host.token);
  try {
    const { r, plain } = await admin(lan);
    assert.equal(r.ok, false, JSON.stringify(r));
    assert.equal(r.error.category, "forbidden");
    assert.match(r.error.message, /types\.admin/);
    assert.deepEqual(plain, { ok: true, value: 2 });
  } finally {
    await lan.close();
  }
});

test("no connection → the call throws; refused arguments still fold without one", { ...TEST, skip }, async () => {
  const page = await openHarness(ctx.context, ctx.host.origin, ctx.host.token);
  try {
    const r = await inPage(page, async (t) => {
      const mount = t.client.mount(await t.client.describe());
      t.transport.disconnect();
      for (let i = 0; i < 100 && t.transport.connected; i++) await new Promise((res) => setTimeout(res, 20));
      const out = { connected: t.transport.connected };
      try {
        out.call = await t.client.services.types.echo_int(1);
      } catch (e) {
        out.thrown = { name: e.name, noConnection: e.noConnection, isClass: e instanceof t.NoConnectionError };
      }
      out.badRequest = await t.client.services.types.echo_int("x");
      out.preAborted = await t.client.services.types.echo_int(1, { signal: AbortSignal.abort() });
      // Connected again: the same mount works.
      await t.transport.connect();
      out.again = await t.client.services.types.echo_int(4);
      await mount.withdraw();
      return out;
    });
    assert.equal(r.connected, false);
    assert.equal(r.call, undefined, `resolved instead of throwing: ${JSON.stringify(r.call)}`);
    assert.deepEqual(r.thrown, { name: "NoConnectionError", noConnection: true, isClass: true });
    assert.equal(r.badRequest.error.category, "bad-request");
    assert.equal(r.preAborted.error.category, "cancelled");
    assert.deepEqual(r.again, { ok: true, value: 4 });
  } finally {
    await page.close();
  }
});

test("unavailable after `agenthost plugins unload remote-types`; back after loading it again", { ...TEST, skip }, async () => {
  await inPage(ctx.page, async (t) => {
    window.unloadMount = t.client.mount(await t.client.describe());
  });
  await ctx.host.unloadPlugin("remote-types");
  try {
    const r = await inPage(ctx.page, async (t) => ({
      echo: await t.client.services.types.echo_int(1),
      nothing: await t.client.services.types.nothing(),
      sessions: await t.client.services.sessions.pending("00000000-0000-7000-8000-000000000000"),
    }));
    assert.equal(r.echo.error.category, "unavailable", JSON.stringify(r.echo));
    assert.match(r.echo.error.message, /types\.echo_int/);
    assert.equal(r.nothing.error.category, "unavailable");
    assert.equal(r.sessions.error.category, "not-found", "the other namespaces are still served");
  } finally {
    await ctx.host.loadPlugin("remote-types");
  }
  const back = await inPage(ctx.page, async (t) => {
    const r = await t.client.services.types.echo_int(8);
    await window.unloadMount.withdraw();
    return r;
  });
  assert.deepEqual(back, { ok: true, value: 8 });
});

test("events: session.created arrives as host/remote-event; ok.ping and session.delta do not", { ...TEST, skip }, async () => {
  const page = ctx.page;
  await inPage(page, async (t) => {
    t.delivered.length = 0;
    t.warnings.length = 0;
    t.transport.frames.host.length = 0;
    t.transport.frames.mux.length = 0;
  });
  // An allowlisted core event.
  const created = await ctx.host.call("session.create", { cwd: ctx.host.cwd, title: "remote events" });
  const sessionId = created.sessionId ?? created.id ?? created.session?.id;
  assert.equal(typeof sessionId, "string", JSON.stringify(created));
  const hasCreated = (id) =>
    inPage(page, async (t, sid) => t.delivered.some((e) => e.name === "session.created" && JSON.stringify(e.args).includes(sid)), id);
  await waitFor(() => hasCreated(sessionId), 10000, `host/remote-event session.created for ${sessionId}\n${failMessage()}`);

  // A plugin's own event, even one it marks allowlisted, and the transient session.delta are not forwarded.
  await ctx.host.loadPlugin("ok");
  try {
    // The browser plugin learns the new method from plugin.mounted: retry while it answers 404.
    const emitted = await waitFor(() => ctx.host.call("ok.emit", { n: 1 }), 10000, "ok.emit");
    assert.deepEqual(emitted, {}, "ok.ping was emitted");
    await ctx.host.call("session.prompt", { sessionId, text: "stream some words back to me please" });
    // The reply's committed session.event shows the prompt ran; a second session.created is the barrier.
    await waitFor(
      () =>
        inPage(page, async (t) =>
          t.delivered.some((e) => e.name === "session.event" && JSON.stringify(e.args).includes("echo: stream some words")),
        ),
      15000,
      `the reply as host/remote-event session.event\n${failMessage()}`,
    );
    const second = await ctx.host.call("session.create", { cwd: ctx.host.cwd });
    const secondId = second.sessionId ?? second.id ?? second.session?.id;
    await waitFor(() => hasCreated(secondId), 10000, "the second session.created");
  } finally {
    await ctx.host.unloadPlugin("ok");
  }
  await sleep(200);
  const r = await inPage(page, async (t) => {
    const remoteFrames = t.transport.frames.host.filter((f) => f.method === "host/remote-event");
    return {
      remoteNames: remoteFrames.map((f) => f.payload?.name),
      shapes: remoteFrames.every((f) => f.kind === "server-request" && f.replyRequired === false && typeof f.payload?.name === "string" && "args" in f.payload),
      delivered: t.delivered.map((e) => e.name),
      muxDeltas: t.transport.frames.mux.filter((f) => f.method === "session.delta").length,
    };
  });
  assert.ok(r.shapes, "every host/remote-event frame is a server-request push with {name, args}");
  assert.ok(r.remoteNames.includes("session.created"));
  assert.ok(r.remoteNames.includes("session.event"));
  assert.ok(r.remoteNames.includes("plugin.mounted"), "plugin.mounted (ok) is forwarded");
  assert.ok(!r.remoteNames.includes("ok.ping"), "ok.ping is not forwarded");
  assert.ok(!r.remoteNames.includes("session.delta"), "session.delta is not forwarded");
  assert.ok(!r.delivered.includes("ok.ping") && !r.delivered.includes("session.delta"));
  assert.deepEqual(new Set(r.delivered), new Set(r.remoteNames));
  assert.ok(r.muxDeltas > 0, "the prompt did stream session.delta (seen on the mux stream)");
});

test("events: the client drops malformed and unlisted frames with a warning; subscriptions end with their mount", { ...TEST, skip }, async () => {
  const r = await inPage(ctx.page, async (t) => {
    t.delivered.length = 0;
    t.warnings.length = 0;
    const out = {};
    const seen = [];
    const off = t.client.onRemoteEvent("session.closed", (args, name) => seen.push({ name, args }));
    try {
      t.client.onRemoteEvent("ok.ping", () => {});
      out.unlisted = "subscribed";
    } catch (e) {
      out.unlisted = e.name;
    }
    const inject = (p) => t.transport.dispatch("host/remote-event", p);
    inject(null);
    inject("session.closed");
    inject({ name: "session.closed" });
    inject({ name: 5, args: {} });
    inject({ name: "session.closed", args: {}, extra: 1 });
    inject({ name: "ok.ping", args: {} });
    inject({ name: "session.delta", args: { sessionId: "s", text: "x" } });
    out.afterBad = { seen: seen.length, delivered: t.delivered.length, warnings: t.warnings.length };
    inject({ name: "session.closed", args: { sessionId: "s1" } });
    off();
    inject({ name: "session.closed", args: { sessionId: "s2" } });
    out.seen = seen;
    // A handler that throws does not stop the others.
    const offBad = t.client.onRemoteEvent("session.closed", () => {
      throw new Error("handler bug");
    });
    const got = [];
    const offGood = t.client.onRemoteEvent("session.closed", (a) => got.push(a.sessionId));
    inject({ name: "session.closed", args: { sessionId: "s3" } });
    offBad();
    offGood();
    out.afterThrow = got;
    // A mount's subscriptions end with it.
    const mount = t.client.mount((await t.client.describe()).filter((d) => d.namespace === "types"));
    const mseen = [];
    mount.onRemoteEvent("session.closed", (a) => mseen.push(a.sessionId));
    inject({ name: "session.closed", args: { sessionId: "m1" } });
    await mount.withdraw();
    inject({ name: "session.closed", args: { sessionId: "m2" } });
    out.mountSeen = mseen;
    out.delivered = t.delivered.map((e) => e.args.sessionId);
    out.warnings = t.warnings.slice();
    return out;
  });
  assert.equal(r.unlisted, "RangeError");
  assert.deepEqual(r.afterBad, { seen: 0, delivered: 0, warnings: 7 });
  assert.deepEqual(r.seen, [{ name: "session.closed", args: { sessionId: "s1" } }]);
  assert.deepEqual(r.delivered, ["s1", "s2", "s3", "m1", "m2"]);
  assert.deepEqual(r.afterThrow, ["s3"]);
  assert.deepEqual(r.mountSeen, ["m1"]);
  assert.ok(r.warnings.some((w) => /malformed host\/remote-event/.test(w)));
  assert.ok(r.warnings.some((w) => /"ok\.ping": not a forwarded event/.test(w)));
  assert.ok(r.warnings.some((w) => /handler of session\.closed threw/.test(w)));
});

test("the page threw nothing uncaught", { ...TEST, skip }, () => {
  const thrown = ctx.page.consoleLines.filter((l) => l.startsWith("pageerror:"));
  assert.deepEqual(thrown, []);
});
