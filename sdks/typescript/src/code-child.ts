// The program a snippet's child process runs (with `node -e`), kept as text so that the child
// needs no file of its own: the permission model then lets it read nothing but its temp folder.
//
// It reads {"code", "input", "timeLimitMs"} on stdin, runs the snippet in a bare vm context (only
// the language's built-ins, `input` and a `console` that buffers lines), and writes one JSON line
// to stdout: {"ok": true, "output": <json text>} or {"ok": false, "code", "type", "message",
// "stack"}; what the snippet logged goes to stderr. Nothing of the host realm (no host function,
// object or error) ever reaches the snippet: values cross as strings.
export const CHILD_SOURCE = String.raw`
'use strict';
const vm = require('node:vm');
const stdout = process.stdout;
const stderr = process.stderr;
const exit = process.exit.bind(process);
const chunks = [];
process.stdin.on('data', (c) => chunks.push(c));
process.stdin.on('end', () => main(Buffer.concat(chunks).toString('utf8')));

// In the snippet's realm: console, refusals, the output check, error description.
const SETUP = ${"`"}(function (inputText) {
  'use strict';
  const g = globalThis;
  const logs = [];
  const show = (v) => {
    if (typeof v === 'string') return v;
    try { const t = JSON.stringify(v); return t === undefined ? String(v) : t; } catch (e) { return String(v); }
  };
  const log = function () { const parts = []; for (let i = 0; i < arguments.length; i++) parts.push(show(arguments[i])); logs.push(parts.join(' ')); if (logs.length > 2000) logs.shift(); };
  Object.defineProperty(g, 'console', { value: Object.freeze({ log: log, info: log, warn: log, error: log, debug: log, trace: log }), enumerable: false });
  const refuse = (name, why) => Object.defineProperty(g, name, { get: function () { throw new Error(name + ' is refused: ' + why); }, enumerable: false });
  refuse('process', 'a code snippet has no process object (no environment variables, no file system, no child processes)');
  refuse('fetch', 'a code snippet has no network');
  refuse('WebSocket', 'a code snippet has no network');
  refuse('XMLHttpRequest', 'a code snippet has no network');
  refuse('Buffer', 'a code snippet has no Node APIs (use Uint8Array)');
  refuse('setTimeout', 'a code snippet has no timers');
  refuse('setInterval', 'a code snippet has no timers');
  Object.defineProperty(g, 'require', { value: function require(id) {
    throw new Error("require('" + String(id) + "') is refused: a code snippet cannot load modules (no file system, network or child processes)");
  }, enumerable: false });
  for (const name of ['SharedArrayBuffer', 'Atomics', 'WebAssembly']) { try { delete g[name]; } catch (e) {} }
  Object.defineProperty(g, 'input', { value: JSON.parse(inputText), writable: true, enumerable: false });

  const check = (v, path, seen) => {
    if (v === null || typeof v === 'string' || typeof v === 'boolean') return;
    if (typeof v === 'number') { if (!Number.isFinite(v)) throw new TypeError(path + ' is ' + v + ', which JSON cannot hold'); return; }
    if (typeof v !== 'object') throw new TypeError(path + ' is a ' + typeof v + ', not JSON');
    if (seen.indexOf(v) >= 0) throw new TypeError(path + ' refers back to itself (a cycle)');
    if (typeof v.toJSON === 'function') return;
    seen.push(v);
    if (Array.isArray(v)) v.forEach((x, i) => check(x === undefined ? null : x, path + '[' + i + ']', seen));
    else {
      const proto = Object.getPrototypeOf(v);
      if (proto !== Object.prototype && proto !== null) throw new TypeError(path + ' is a ' + ((v.constructor && v.constructor.name) || 'object') + ', not a plain object');
      for (const k of Object.keys(v)) if (v[k] !== undefined) check(v[k], path + '.' + k, seen);
    }
    seen.pop();
  };
  const describe = (e) => {
    try {
      if (e instanceof Error || (e && typeof e === 'object' && 'message' in e)) {
        return JSON.stringify({ type: String(e.name || 'Error'), message: String(e.message), stack: String(e.stack || '') });
      }
      return JSON.stringify({ type: typeof e, message: 'the snippet threw a non-Error value: ' + show(e), stack: '' });
    } catch (x) { return JSON.stringify({ type: 'Error', message: 'the snippet threw something that cannot be described', stack: '' }); }
  };
  let state;
  const finish = (value) => {
    try {
      if (typeof result !== 'undefined') value = result; // eslint-disable-line no-undef
      if (value === undefined) value = null;
      check(value, 'result', []);
      state = JSON.stringify({ ok: true, output: JSON.stringify(value) });
    } catch (e) {
      const d = JSON.parse(describe(e));
      state = JSON.stringify({ ok: false, code: 'INVALID_OUTPUT', type: d.type, message: "the snippet's result is not JSON: " + d.message, stack: '' });
    }
  };
  return {
    settle: (value) => {
      if (value !== null && (typeof value === 'object' || typeof value === 'function') && typeof value.then === 'function') {
        Promise.resolve(value).then(finish, (e) => { state = JSON.stringify(Object.assign({ ok: false, code: 'CODE_ERROR' }, JSON.parse(describe(e)))); });
      } else finish(value);
    },
    fail: (e) => { state = JSON.stringify(Object.assign({ ok: false, code: 'CODE_ERROR' }, JSON.parse(describe(e)))); },
    state: () => state,
    logs: () => logs.join(String.fromCharCode(10)),
  };
})${"`"};

function main(text) {
  const request = JSON.parse(text);
  // Harden the host realm before any snippet code runs.
  for (const name of ['fetch', 'WebSocket', 'EventSource', 'require', 'module', 'exports', '__filename', '__dirname', 'Buffer']) {
    try { delete globalThis[name]; } catch (e) {}
  }
  try { process.kill = () => { throw new Error('process.kill is refused'); }; } catch (e) {}
  const context = vm.createContext(Object.create(null), { name: 'snippet', codeGeneration: { strings: false, wasm: false } });
  const helper = vm.runInContext(SETUP, context)(JSON.stringify(request.input === undefined ? null : request.input));
  const failInContext = vm.runInContext('(m) => { throw new Error(m); }', context);
  const finishLine = (answer) => {
    let logs = '';
    try { logs = helper.logs(); } catch (e) {}
    if (logs) stderr.write(logs + '\n');
    stdout.write(answer + '\n', () => exit(0));
  };
  try {
    const script = new vm.Script(request.code, {
      filename: 'snippet.js',
      importModuleDynamically: () => failInContext('import() is refused: a code snippet cannot load modules (no file system, network or child processes)'),
    });
    const value = script.runInContext(context, { timeout: Math.max(1, Math.floor(request.timeLimitMs)), breakOnSigint: false });
    helper.settle(value);
  } catch (error) {
    if (error && error.code === 'ERR_SCRIPT_EXECUTION_TIMEOUT') {
      return finishLine(JSON.stringify({ ok: false, code: 'TIMEOUT', type: 'TimeoutError', message: 'timeout', stack: '' }));
    }
    helper.fail(error);
  }
  const poll = () => {
    const state = helper.state();
    if (state !== undefined) return finishLine(state);
    setTimeout(poll, 2);
  };
  poll();
}
`;
