"""The Python code runner: serves CODE nodes (queue ``code.python``).

Each task's input is ``{"code": "<snippet>", "input": <json>}``, plus
``"secrets": ["NAME", ...]`` when the node declares secrets (names only;
the server hands their values with the task). The snippet runs in a fresh
``python -I`` subprocess with

- ``input`` in scope (the node's input, as JSON: dict, list, str, ...);
  a node that declares secrets finds their values in it under
  ``input["secrets"]["NAME"]`` (its input must then be an object or absent,
  else the task fails with ``SECRETS_NEED_OBJECT_INPUT``, non-retryable);
- a time limit (default 30 s, and never past the attempt's deadline): past it
  the process group is killed and the task fails with code ``TIMEOUT``,
  **non-retryable** (a snippet that ran out of time once will run out again;
  a node that wants another try says so with an error edge or a larger
  limit);
- a memory limit (default 512 MiB, ``RLIMIT_AS`` set in the child before the
  snippet runs): a snippet that exceeds it fails with code ``MEMORY_LIMIT``,
  non-retryable.

**The output convention**: the snippet's output is the variable ``result`` if
the snippet assigns it; otherwise the value of its final statement when that
is an expression (``input["a"] + 1``); otherwise ``null``. The output must be
JSON (dict, list, str, int, float, bool, None), else the task fails with
``INVALID_OUTPUT`` (non-retryable).

An exception in the snippet fails the task with code ``CODE_ERROR``
(retryable: the node's retry policy decides; list ``CODE_ERROR`` in
``retry.non_retryable`` to stop at once), the message ``Type: text`` and the
details ``{"type", "message", "traceback", "stderr"}``. What the snippet
prints goes to its stderr, which is logged and returned (its tail) in the
failure details. A child that dies otherwise (a signal, a crash) fails with
``CODE_CRASHED``, retryable.

**Secrets** (docs/secrets.md) reach the snippet with its input, on the
child's standard input: never in its argv, environment or a file. Before
the runner reports, every value is replaced by ``[secret NAME]`` in the
output (strings and object keys, at any depth), the failure message and
details (traceback, stderr) and the snippet's logged output; a value the
snippet transforms (encodes, reverses) is not recognised. A node that
declares none gets no ``secrets`` key. A declared secret the server sent no
value for fails the attempt with ``SECRET_UNAVAILABLE``, retryable.

**The sandbox** (see ``sdks/python/README.md``, "What a snippet can reach"):
each snippet's process starts with an empty environment (no token, no
server address) in new network, mount and PID namespaces: it has no
network at all (not even loopback), sees only its own processes, and gets
private, empty ``/tmp``, ``/var/tmp`` and ``/dev/shm`` (its own temporary
folder, gone when it ends). When the runner is root, the snippet runs as
``nobody`` with no capabilities and ``no_new_privs``; a process tree it
forks dies with it. Where the kernel gives no namespaces, the runner
refuses to start unless told ``--allow-network-in-snippets``.

Run it with ``composer-code-runner --address HOST:PORT`` or
``Worker.serve_code()``.
"""

from __future__ import annotations

import argparse
import logging
import os

from ._code_handler import (
    DEFAULT_MEMORY_LIMIT,
    DEFAULT_TIME_LIMIT,
    Sandbox,
    SandboxUnavailable,
    SnippetResult,
    default_sandbox,
    detect_sandbox,
    make_handler,
    run_snippet,
)
from .worker import Worker


def _parse_bytes(text: str) -> int:
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    text = text.strip().lower().removesuffix("ib").removesuffix("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def main(argv: list[str] | None = None) -> None:
    """The ``composer-code-runner`` console script: serves ``code.python`` until SIGTERM."""
    parser = argparse.ArgumentParser(prog="composer-code-runner", description="Serve Python CODE nodes of a Composer server.")
    parser.add_argument("--address", default=None, help="server host:port, http://host:port or https://host:port (default: COMPOSER_ADDRESS, else 127.0.0.1:7070)")
    parser.add_argument("--token", default=os.environ.get("COMPOSER_TOKEN"), help="bearer token (COMPOSER_TOKEN)")
    parser.add_argument("--slots", type=int, default=4, help="snippets run at once")
    parser.add_argument("--queue", default="code.python", help="the queue to serve")
    parser.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT, help="seconds per snippet")
    parser.add_argument("--memory-limit", type=_parse_bytes, default=DEFAULT_MEMORY_LIMIT, help="address space per snippet, e.g. 512M (0: none)")
    parser.add_argument("--drain-timeout", type=float, default=30.0, help="seconds to finish running snippets on SIGTERM")
    parser.add_argument(
        "--allow-network-in-snippets",
        action="store_true",
        help="start even where the kernel gives no namespaces (snippets can then reach the network)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    worker = Worker(args.address, token=args.token, slots=args.slots, drain_timeout=args.drain_timeout)
    try:
        worker.serve_code(
            queue=args.queue,
            time_limit=args.time_limit,
            memory_limit=args.memory_limit,
            allow_network=args.allow_network_in_snippets,
        )
    except SandboxUnavailable as error:
        parser.exit(2, f"composer-code-runner: {error}\n")
    worker.run()


__all__ = [
    "DEFAULT_MEMORY_LIMIT",
    "DEFAULT_TIME_LIMIT",
    "Sandbox",
    "SandboxUnavailable",
    "SnippetResult",
    "default_sandbox",
    "detect_sandbox",
    "main",
    "make_handler",
    "run_snippet",
]
