// leasecast.d.ts declares every export of leasecast.js, and nothing it lacks.
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { test } from "node:test";

import * as leasecast from "../leasecast.js";

test("the TypeScript declarations match the module's exports", async () => {
  const text = await readFile(new URL("../leasecast.d.ts", import.meta.url), "utf8");
  const declared = new Set(
    [...text.matchAll(/^export declare (?:class|function|const) (\w+)/gm)].map((m) => m[1]),
  );
  const exported = new Set(Object.keys(leasecast).filter((name) => name !== "default"));
  assert.deepEqual([...exported].filter((n) => !declared.has(n)).sort(), [], "not declared");
  assert.deepEqual([...declared].filter((n) => !exported.has(n)).sort(), [], "not exported");
  assert.match(text, /^export default Leasecast;$/m);
  assert.equal(leasecast.default, leasecast.Leasecast);
});

test("package.json points at the module and its declarations", async () => {
  const pkg = JSON.parse(await readFile(new URL("../package.json", import.meta.url), "utf8"));
  assert.equal(pkg.type, "module");
  assert.equal(pkg.types, "leasecast.d.ts");
  assert.deepEqual(pkg.exports["."], { types: "./leasecast.d.ts", default: "./leasecast.js" });
  assert.equal(Object.keys(pkg.dependencies ?? {}).length, 0);
});
