"""The code runner's handler and sandbox: what :mod:`composer.code_runner` documents and serves.

It builds on :mod:`composer.task_context` alone, never on the worker, so
:meth:`Worker.serve_code` can register :func:`make_handler` while the
``composer-code-runner`` script (:func:`composer.code_runner.main`) builds a
worker around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .errors import NonRetryableError, TaskError
from .task_context import Handler, TaskContext

DEFAULT_TIME_LIMIT = 30.0
"""Seconds a snippet may run."""
DEFAULT_MEMORY_LIMIT = 512 * 1024 * 1024
"""Bytes of address space a snippet may use (RLIMIT_AS)."""
_STDERR_TAIL = 8_000
_NOBODY = 65534
"""The unprivileged user (and group) a root runner's snippets run as."""
_NAMESPACES = ("--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc", "--propagation", "private")


class SandboxUnavailable(RuntimeError):
    """The kernel gives this runner no namespaces, and snippets were not allowed the network."""


@dataclass(frozen=True)
class Sandbox:
    """How snippets are isolated on this machine (see :func:`detect_sandbox`)."""

    mode: str
    """``root``: namespaces and the user nobody; ``userns``: namespaces inside a user
    namespace (the runner is not root); ``none``: an empty environment and a
    temporary working folder only (``--allow-network-in-snippets``)."""
    python: str
    """The interpreter snippets run with: one the snippet's user can read."""

    def command(self, child: str, memory_limit: int) -> list[str]:
        """The argv that runs ``child`` (the program below) in this sandbox."""
        program = [self.python, "-I", "-c", child, str(memory_limit), self.mode]
        if self.mode == "root":
            return [_unshare(), *_NAMESPACES, *program]
        if self.mode == "userns":
            return [_unshare(), "--user", "--map-root-user", *_NAMESPACES, *program]
        return program


def _unshare() -> str:
    return shutil.which("unshare") or "/usr/bin/unshare"


def _world_readable(path: str) -> bool:
    """True when every folder above ``path`` may be searched, and the path read, by any user."""
    path = os.path.realpath(path)
    parts = path.split(os.sep)
    for depth in range(2, len(parts) + 1):
        folder = os.sep.join(parts[:depth]) or os.sep
        try:
            mode = os.stat(folder).st_mode
        except OSError:
            return False
        if not mode & stat.S_IROTH or (stat.S_ISDIR(mode) and not mode & stat.S_IXOTH):
            return False
    return True


def _snippet_python(mode: str) -> str:
    """An interpreter whose whole installation the snippet's user can read."""
    if mode != "root":
        return sys.executable
    candidates = [sys.executable, os.path.join(sys.base_prefix, "bin", "python3"), "/usr/bin/python3"]
    for candidate in candidates:
        prefix = os.path.dirname(os.path.dirname(os.path.realpath(candidate)))
        if os.path.exists(candidate) and _world_readable(candidate) and _world_readable(prefix):
            return candidate
    raise SandboxUnavailable(
        "no Python interpreter readable by the user nobody was found for snippets "
        f"(tried {', '.join(candidates)}); install python3 system-wide"
    )


def _probe(sandbox: Sandbox) -> bool:
    """True when a trivial snippet runs in ``sandbox``."""
    try:
        done = subprocess.run(
            sandbox.command(_CHILD, 0),
            input=b'{"code": "1"}',
            capture_output=True,
            env={},
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and b'"ok": true' in done.stdout


def detect_sandbox(*, allow_network: bool = False) -> Sandbox:
    """The strongest sandbox this machine gives, checked by running a snippet in it.

    Raises :class:`SandboxUnavailable` when there are no namespaces and
    ``allow_network`` is false.
    """
    modes = ["root"] if os.geteuid() == 0 else ["userns"]
    for mode in modes:
        sandbox = Sandbox(mode, _snippet_python(mode))
        if _probe(sandbox):
            return sandbox
    if allow_network:
        logging.getLogger("composer.code_runner").warning(
            "no namespaces here: snippets run with an empty environment but CAN reach the network and the runner's files"
        )
        return Sandbox("none", sys.executable)
    raise SandboxUnavailable(
        "this machine gives the code runner no namespaces (unshare failed), so snippets could reach the network; "
        "run the runner as root, enable unprivileged user namespaces, or pass --allow-network-in-snippets"
    )


_sandbox: Sandbox | None = None


def default_sandbox() -> Sandbox:
    """The sandbox :func:`run_snippet` uses when given none (detected once)."""
    global _sandbox
    if _sandbox is None:
        _sandbox = detect_sandbox()
    return _sandbox

# The program the child runs: reads {"code", "input"} on stdin, sets the memory
# limit, runs the snippet with its stdout sent to stderr, and writes one JSON
# object to the original stdout: {"ok": true, "output": ...} or
# {"ok": false, "code": ..., "type": ..., "message": ..., "traceback": ...}.
_CHILD = r"""
import ast, ctypes, json, os, resource, sys, traceback
def _mount_private_tmp(mode):
    # each a fresh tmpfs in this mount namespace: the snippet's own folders
    libc = ctypes.CDLL(None, use_errno=True)
    owner = ",uid=65534,gid=65534" if mode == "root" else ""
    for folder, size in (("/tmp", "64m"), ("/var/tmp", "16m"), ("/dev/shm", "16m")):
        if os.path.isdir(folder):
            options = ("size=%s,mode=0700%s" % (size, owner)).encode()
            if libc.mount(b"tmpfs", folder.encode(), b"tmpfs", 2 | 4 | 8, options) != 0:
                raise OSError(ctypes.get_errno(), "mount tmpfs on " + folder)
def _drop_privileges():
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    if os.getuid() != 65534 or os.geteuid() != 65534:
        raise OSError("could not become nobody")
    ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
def _reap_until(snippet):
    # PID 1 of the namespace: reaps orphans, ends as the snippet ended; its
    # exit takes every process left in the namespace with it
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        if pid == snippet:
            os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
def _main():
    limit, mode = int(sys.argv[1]), sys.argv[2]
    request = json.loads(sys.stdin.read())
    if mode in ("root", "userns"):
        _mount_private_tmp(mode)
        os.chdir("/tmp")
    if mode == "root":
        _drop_privileges()
    resource.setrlimit(resource.RLIMIT_NPROC, (256, 256))
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if mode in ("root", "userns"):
        snippet = os.fork()
        if snippet:
            _reap_until(snippet)
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    if limit > 0:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    scope = {"__name__": "__snippet__", "__builtins__": __builtins__, "input": request.get("input")}
    try:
        tree = ast.parse(request["code"], "<snippet>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<snippet>", "exec"), scope)
        value = eval(compile(last, "<snippet>", "eval"), scope) if last is not None else None
        if "result" in scope:
            value = scope["result"]
        try:
            text = json.dumps({"ok": True, "output": value}, allow_nan=False)
        except (TypeError, ValueError) as error:
            text = json.dumps({"ok": False, "code": "INVALID_OUTPUT", "type": type(error).__name__,
                               "message": "the snippet's result is not JSON: %s" % error, "traceback": ""})
    except MemoryError as error:
        text = json.dumps({"ok": False, "code": "MEMORY_LIMIT", "type": "MemoryError",
                           "message": "the snippet exceeded its memory limit of %d bytes" % limit,
                           "traceback": traceback.format_exc()})
    except BaseException as error:
        text = json.dumps({"ok": False, "code": "CODE_ERROR", "type": type(error).__name__,
                           "message": ("%s: %s" % (type(error).__name__, error)).rstrip(": "),
                           "traceback": traceback.format_exc()})
    out.write(text)
    out.flush()
_main()
"""


class Redactor:
    """Replaces secret values by ``[secret NAME]`` in text and in JSON values (object keys too).

    A value is also caught as Python's ``repr`` and JSON escape it (a
    traceback's ``KeyError: 'a\\nb'``). One pass, longest form first: a
    value containing another is replaced whole, and a replacement is never
    itself rewritten. A value the snippet transforms (reversed, encoded) is
    not recognised.
    """

    def __init__(self, secrets: Mapping[str, str]) -> None:
        names: dict[str, str] = {}
        for name in sorted(secrets):
            value = secrets[name]
            for form in (value, repr(value)[1:-1], json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]):
                if form:  # an empty form would match everywhere
                    names.setdefault(form, name)
        self._names = names
        longest_first = sorted(names, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, longest_first))) if names else None

    def __repr__(self) -> str:
        return f"Redactor({sorted(set(self._names.values()))!r})"

    def text(self, text: str) -> str:
        """``text`` with every value replaced."""
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda found: f"[secret {self._names[found.group(0)]}]", text)

    def value(self, value: Any) -> Any:
        """A JSON value with every value replaced in its strings and object keys, at any depth."""
        if self._pattern is None:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.value(item) for item in value]
        if isinstance(value, dict):
            return {self.text(str(key)): self.value(item) for key, item in value.items()}
        return value


def _json_kind(value: Any) -> str:
    """How a JSON value is named in a message: ``a list``, ``a string``, ..."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    return type(value).__name__


@dataclass
class SnippetResult:
    """What running a snippet gave: its output, or a failure code with message and details."""

    ok: bool
    """True when the snippet finished and its result is JSON."""
    output: Any = None
    """The snippet's result (see the module's convention)."""
    code: str = ""
    """On failure: CODE_ERROR, TIMEOUT, MEMORY_LIMIT, INVALID_OUTPUT, CODE_CRASHED or
    SECRETS_NEED_OBJECT_INPUT."""
    message: str = ""
    """On failure: what happened."""
    details: dict[str, Any] = field(default_factory=dict)
    """On failure: type, message, traceback, stderr (tail)."""
    stderr: str = ""
    """What the snippet printed (stdout and stderr both)."""
    seconds: float = 0.0
    """How long it ran."""

    @property
    def retryable(self) -> bool:
        """Whether another attempt may help: CODE_ERROR and CODE_CRASHED yes; limits and bad outputs no."""
        return self.code in ("CODE_ERROR", "CODE_CRASHED")


async def run_snippet(
    code: str,
    input: Any = None,
    *,
    secrets: Mapping[str, str] | None = None,
    time_limit: float = DEFAULT_TIME_LIMIT,
    memory_limit: int | None = DEFAULT_MEMORY_LIMIT,
    sandbox: Sandbox | None = None,
) -> SnippetResult:
    """Runs ``code`` in a sandboxed subprocess with ``input`` in scope, within the time and memory limits.

    ``secrets`` (values by name, docs/secrets.md) go in the snippet's input
    under ``secrets``: the input must then be an object (None counts as
    ``{}``), else the result is the non-retryable failure
    ``SECRETS_NEED_OBJECT_INPUT`` and nothing runs. They travel to the child
    with the input, on its standard input, never in its argv, environment or
    a file; and each value is replaced by ``[secret NAME]`` in everything
    the result carries (output, message, details, stderr). Without
    ``secrets`` the input goes as it is.

    Cancelling the call kills the subprocess (and everything it started).
    """
    redactor = Redactor(secrets or {})
    if secrets is not None:
        if input is None:
            input = {}
        if not isinstance(input, dict):
            return _needs_object_input(input)
        input = {**input, "secrets": dict(secrets)}
    sandbox = sandbox or default_sandbox()
    request = json.dumps({"code": code, "input": input}).encode()
    # without namespaces, the snippet's folder is one made for it here
    workdir = tempfile.mkdtemp(prefix="composer-snippet-") if sandbox.mode == "none" else None
    try:
        return await _run_in(sandbox, request, workdir, time_limit, memory_limit, redactor)
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


def _needs_object_input(input: Any) -> SnippetResult:
    message = (
        f"the node declares secrets, which its snippet gets in its input under \"secrets\", "
        f"so the input must be an object (or absent), not {_json_kind(input)}"
    )
    return SnippetResult(
        ok=False,
        code="SECRETS_NEED_OBJECT_INPUT",
        message=message,
        details={"type": "", "message": message, "traceback": "", "stderr": ""},
    )


async def _run_in(
    sandbox: Sandbox,
    request: bytes,
    workdir: str | None,
    time_limit: float,
    memory_limit: int | None,
    redactor: Redactor,
) -> SnippetResult:
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        *sandbox.command(_CHILD, memory_limit or 0),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        env={},
        cwd=workdir,
    )
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    # Read both pipes as the child writes, so nothing is lost when it must be killed.
    readers = (asyncio.ensure_future(process.stdout.read()), asyncio.ensure_future(process.stderr.read()))
    try:
        process.stdin.write(request)
        with contextlib.suppress(ConnectionError):
            await process.stdin.drain()
        process.stdin.close()
        await asyncio.wait_for(process.wait(), time_limit)
    except asyncio.TimeoutError:
        _kill(process)
        await process.wait()
        _, stderr_bytes = await _collect(readers)
        stderr = redactor.text(stderr_bytes.decode(errors="replace"))
        message = f"the snippet did not finish within its time limit of {time_limit:g} s"
        return SnippetResult(
            ok=False,
            code="TIMEOUT",
            message=message,
            details={"type": "TimeoutError", "message": message, "traceback": "", "stderr": stderr[-_STDERR_TAIL:]},
            stderr=stderr,
            seconds=time.monotonic() - started,
        )
    except BaseException:
        _kill(process)
        for reader in readers:
            reader.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.shield(process.wait())
        raise
    stdout, stderr_bytes = await _collect(readers)
    seconds = time.monotonic() - started
    raw_stderr = stderr_bytes.decode(errors="replace")
    # Redacted whole, before any tail is cut: a cut must not leave part of a value.
    stderr = redactor.text(raw_stderr)
    try:
        answer = json.loads(stdout.decode()) if stdout else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        why = _how_it_ended(process.returncode, sandbox)
        code_ = "CODE_CRASHED"
        if "MemoryError" in raw_stderr:
            code_ = "MEMORY_LIMIT"
        message = f"the snippet's process ended without a result ({why})"
        return SnippetResult(
            ok=False,
            code=code_,
            message=message,
            details={"type": "", "message": message, "traceback": "", "stderr": stderr[-_STDERR_TAIL:]},
            stderr=stderr,
            seconds=seconds,
        )
    if answer.get("ok"):
        return SnippetResult(ok=True, output=redactor.value(answer.get("output")), stderr=stderr, seconds=seconds)
    message = redactor.text(str(answer.get("message", "")))
    return SnippetResult(
        ok=False,
        code=str(answer.get("code", "CODE_ERROR")),
        message=message,
        details={
            "type": redactor.value(answer.get("type", "")),
            "message": message,
            "traceback": redactor.value(answer.get("traceback", "")),
            "stderr": stderr[-_STDERR_TAIL:],
        },
        stderr=stderr,
        seconds=seconds,
    )


def _how_it_ended(returncode: int | None, sandbox: Sandbox) -> str:
    """``signal N`` or ``exit code N``; in a namespace, PID 1 reports a signal as 128 + N."""
    if returncode is not None and returncode < 0:
        return f"signal {-returncode}"
    if returncode is not None and returncode > 128 and sandbox.mode != "none":
        return f"signal {returncode - 128}"
    return f"exit code {returncode}"


async def _collect(readers: tuple[asyncio.Future[bytes], asyncio.Future[bytes]]) -> tuple[bytes, bytes]:
    """The pipes' contents; a grandchild still holding a pipe open cannot make this hang."""
    done, pending = await asyncio.wait(readers, timeout=2.0)
    for reader in pending:
        reader.cancel()
    return tuple(r.result() if r in done and not r.cancelled() and r.exception() is None else b"" for r in readers)  # type: ignore[return-value]


def _kill(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        process.kill()


def _declared_secrets(task_input: dict[str, Any], held: Mapping[str, str]) -> dict[str, str] | None:
    """The values of the secrets a CODE task's node declares (its input's ``secrets``, names
    only), from those the server handed with the task; None when it declares none, so the
    snippet gets no ``secrets`` key at all.

    Only the declared names are taken, whatever else was handed. A name the server sent no
    value for fails the attempt with SECRET_UNAVAILABLE (retryable), as the server itself
    does when it cannot read one: a snippet never runs without what it declared.
    """
    names = task_input.get("secrets")
    if names is None or names == []:
        return None
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise NonRetryableError('a CODE task\'s "secrets" must be a list of secret names', code="BAD_CODE_INPUT")
    missing = sorted({name for name in names if name not in held})
    if missing:
        raise TaskError(
            f"the server handed no value for the secret(s) {', '.join(missing)} this node declares",
            code="SECRET_UNAVAILABLE",
            retryable=True,
        )
    return {name: held[name] for name in names}


def make_handler(
    *, time_limit: float | None = None, memory_limit: int | None = None, allow_network: bool = False
) -> Handler:
    """The task handler of the code runner (what :meth:`Worker.serve_code` registers).

    Detects the sandbox at once, so a runner that cannot isolate snippets
    fails here (:class:`SandboxUnavailable`), before it polls.
    """
    limit_seconds = DEFAULT_TIME_LIMIT if time_limit is None else time_limit
    limit_bytes = DEFAULT_MEMORY_LIMIT if memory_limit is None else memory_limit
    sandbox = detect_sandbox(allow_network=allow_network)

    async def run_code(ctx: TaskContext) -> Any:
        task_input = ctx.input
        if not isinstance(task_input, dict) or not isinstance(task_input.get("code"), str):
            raise NonRetryableError('a CODE task needs the input {"code": "<snippet>", "input": ...}', code="BAD_CODE_INPUT")
        secrets = _declared_secrets(task_input, ctx.secrets)
        seconds = limit_seconds
        if ctx.deadline is not None:
            seconds = min(seconds, max(0.0, (ctx.deadline - datetime.now(timezone.utc)).total_seconds()))
        result = await run_snippet(
            task_input["code"],
            task_input.get("input"),
            secrets=secrets,
            time_limit=seconds,
            memory_limit=limit_bytes,
            sandbox=sandbox,
        )
        if result.stderr:
            ctx.logger.info("snippet output:\n%s", result.stderr[-_STDERR_TAIL:])
        if result.ok:
            return result.output
        raise TaskError(result.message, code=result.code, retryable=result.retryable, details=result.details)

    return run_code


__all__ = [
    "DEFAULT_MEMORY_LIMIT",
    "DEFAULT_TIME_LIMIT",
    "Redactor",
    "Sandbox",
    "SandboxUnavailable",
    "SnippetResult",
    "default_sandbox",
    "detect_sandbox",
    "make_handler",
    "run_snippet",
]
