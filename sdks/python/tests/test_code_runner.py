"""The code runner's subprocess: the output convention, tracebacks, the time and memory limits."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from typing import Any

import pytest

from composer import _code_handler
from composer.code_runner import Sandbox, SandboxUnavailable, SnippetResult, default_sandbox, detect_sandbox, run_snippet


def run(code: str, input: Any = None, **kwargs: Any) -> SnippetResult:
    return asyncio.run(run_snippet(code, input, **kwargs))


def test_final_expression_and_result_variable_and_input() -> None:
    assert run("input['a'] + 1", {"a": 41}).output == 42
    assert run("x = 2\nx * input", 5).output == 10
    assert run("result = {'total': sum(input)}\nprint('hi')", [1, 2, 3]).output == {"total": 6}
    assert run("y = 1").output is None
    # `result` wins over a final expression.
    assert run("result = 'r'\n'last'").output == "r"


def test_prints_go_to_stderr_not_to_the_result() -> None:
    outcome = run("print('hello from the snippet')\n7")
    assert outcome.ok and outcome.output == 7
    assert "hello from the snippet" in outcome.stderr


def test_an_exception_is_reported_with_its_traceback() -> None:
    outcome = run("def f(x):\n    return 1 / x\nf(input)", 0)
    assert not outcome.ok
    assert outcome.code == "CODE_ERROR" and outcome.retryable
    assert outcome.message == "ZeroDivisionError: division by zero"
    assert outcome.details["type"] == "ZeroDivisionError"
    assert 'File "<snippet>", line 2, in f' in outcome.details["traceback"]
    syntax = run("def (")
    assert syntax.code == "CODE_ERROR" and syntax.details["type"] == "SyntaxError"


def test_a_snippet_that_loops_forever_is_stopped_at_its_time_limit() -> None:
    started = time.monotonic()
    outcome = run("while True:\n    pass", time_limit=1.0)
    elapsed = time.monotonic() - started
    assert not outcome.ok and outcome.code == "TIMEOUT" and not outcome.retryable
    assert "1 s" in outcome.message
    assert 1.0 <= elapsed < 5.0


def test_a_snippet_that_forks_a_sleeper_is_killed_with_its_tree() -> None:
    marker = _marker()
    code = f"import subprocess\np = subprocess.Popen(['sleep', '{marker}'])\nwhile True: pass"
    outcome = run(code, time_limit=1.5)
    assert outcome.code == "TIMEOUT"
    assert _gone(marker)


def _marker() -> str:
    """A number no other process on this machine has on its command line."""
    return str(100_000 + uuid.uuid4().int % 800_000)


def _gone(marker: str, within: float = 3.0) -> bool:
    """True once no process on the host runs ``sleep <marker>``."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(_cmdline(pid) == ["sleep", marker] for pid in os.listdir("/proc") if pid.isdigit()):
            return True
        time.sleep(0.05)
    return False


def _cmdline(pid: str) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def test_the_memory_limit_holds() -> None:
    outcome = run("x = bytearray(400 * 1024 * 1024)\nlen(x)", memory_limit=200 * 1024 * 1024)
    assert not outcome.ok and outcome.code == "MEMORY_LIMIT" and not outcome.retryable
    fine = run("len(bytearray(20 * 1024 * 1024))", memory_limit=200 * 1024 * 1024)
    assert fine.ok and fine.output == 20 * 1024 * 1024


def test_a_result_that_is_not_json_fails_without_retry() -> None:
    outcome = run("result = {1, 2}")
    assert outcome.code == "INVALID_OUTPUT" and not outcome.retryable


def test_a_crashed_child_is_reported() -> None:
    outcome = run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    assert outcome.code == "CODE_CRASHED" and "signal 9" in outcome.message


def test_cancelling_kills_the_child() -> None:
    async def main() -> None:
        task = asyncio.create_task(run_snippet("import time\nprint(__import__('os').getpid(), flush=True)\ntime.sleep(60)"))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    started = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - started < 5


# The sandbox: what a snippet can reach (sdks/python/README.md).


def test_a_snippet_sees_an_empty_environment_and_none_of_the_runners_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPOSER_TOKEN", "the-runners-token")
    monkeypatch.setenv("COMPOSER_ADDRESS", "127.0.0.1:7070")
    outcome = run("import os\nresult = dict(os.environ)")
    assert outcome.ok, outcome
    assert "COMPOSER_TOKEN" not in outcome.output and "COMPOSER_ADDRESS" not in outcome.output
    assert set(outcome.output) <= {"LC_CTYPE"}, outcome.output  # Python's own locale coercion
    seen = run("import os\nsorted(int(p) for p in os.listdir('/proc') if p.isdigit())")
    assert seen.ok and max(seen.output) < 10, f"the snippet sees only its own processes: {seen.output}"
    environ = run("open('/proc/1/environ').read()")
    assert (environ.ok and "the-runners-token" not in environ.output) or "PermissionError" in environ.message


def test_a_snippet_has_no_network_not_even_loopback() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    try:
        outcome = run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)")
        assert not outcome.ok and outcome.code == "CODE_ERROR"
        assert "Network is unreachable" in outcome.message, outcome.message
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()
    interfaces = run("[line.split(':')[0].strip() for line in open('/proc/net/dev').readlines()[2:]]")
    assert interfaces.ok and interfaces.output == ["lo"], interfaces.output
    routes = run("open('/proc/net/route').readlines()[1:]")
    assert routes.ok and routes.output == [], "no route leads anywhere"
    lookup = run("import socket\nsocket.getaddrinfo('example.com', 80)")
    assert not lookup.ok and lookup.code == "CODE_ERROR"


def test_a_snippet_writes_only_in_its_own_folder_which_goes_with_it() -> None:
    name = f"composer-escape-{uuid.uuid4().hex}"
    outcome = run(f"import os\nopen('/tmp/{name}', 'w').write('x')\nresult = [os.getcwd(), os.listdir('/tmp')]")
    assert outcome.ok and outcome.output == ["/tmp", [name]], outcome.output
    assert not os.path.exists(f"/tmp/{name}"), "the host's /tmp is untouched"
    again = run("import os\nos.listdir('/tmp')")
    assert again.ok and again.output == [], "a new snippet starts with an empty folder"
    if default_sandbox().mode == "root":
        # folders that exist outside /tmp (the runner's own folder may be under
        # the host's /tmp, which a snippet does not even see)
        for path in ("/etc/composer-escape", "/var/composer-escape", "/usr/composer-escape"):
            refused = run(f"open({path!r}, 'w')")
            assert refused.code == "CODE_ERROR" and "PermissionError" in refused.message, (path, refused.message)
            assert not os.path.exists(path)


def test_a_snippet_cannot_read_another_snippets_files() -> None:
    async def both() -> tuple[SnippetResult, SnippetResult]:
        writer = asyncio.create_task(run_snippet("import time\nopen('/tmp/secret', 'w').write('mine')\ntime.sleep(2)\n'done'"))
        await asyncio.sleep(0.7)
        reader = await run_snippet("import os\nresult = [os.listdir('/tmp'), open('/tmp/secret').read()]")
        return await writer, reader

    writer, reader = asyncio.run(both())
    assert writer.ok and writer.output == "done"
    assert not reader.ok and reader.details["type"] == "FileNotFoundError", reader


def test_a_process_tree_a_snippet_forks_dies_with_it() -> None:
    marker = _marker()
    code = (
        "import os, subprocess\n"
        f"children = [subprocess.Popen(['sleep', '{marker}']) for _ in range(5)]\n"
        "if os.fork() == 0:\n"
        f"    os.execvp('sleep', ['sleep', '{marker}'])\n"
        "len(children)"
    )
    outcome = run(code)
    assert outcome.ok and outcome.output == 5
    assert _gone(marker), "no process of the snippet outlives it"
    bomb = run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", time_limit=2.0)
    assert bomb.code in ("TIMEOUT", "CODE_ERROR"), bomb
    leftover = run("1")
    assert leftover.ok, "the runner still works after a fork bomb"


def test_a_snippet_cannot_raise_its_privileges() -> None:
    outcome = run("import os\nos.setuid(0)")
    assert not outcome.ok and outcome.code == "CODE_ERROR"
    assert outcome.message == "PermissionError: [Errno 1] Operation not permitted"
    if default_sandbox().mode == "root":
        who = run("import os\n[os.getuid(), os.geteuid(), os.getgid(), os.getgroups()]")
        assert who.output == [65534, 65534, 65534, []]
        caps = run("[l.split()[1] for l in open('/proc/self/status') if l.startswith(('CapEff', 'CapPrm', 'NoNewPrivs'))]")
        assert caps.output == ["0000000000000000", "0000000000000000", "1"], caps.output


def test_without_namespaces_the_runner_refuses_unless_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_code_handler, "_unshare", lambda: "/bin/false")
    with pytest.raises(SandboxUnavailable, match="--allow-network-in-snippets"):
        detect_sandbox()
    allowed = detect_sandbox(allow_network=True)
    assert allowed == Sandbox("none", allowed.python)
    marker = uuid.uuid4().hex
    outcome = run(f"import os\nopen('{marker}', 'w')\n[os.getcwd(), dict(os.environ)]", sandbox=allowed)
    assert outcome.ok
    folder, environment = outcome.output
    assert "COMPOSER_TOKEN" not in environment
    assert os.path.basename(folder).startswith("composer-snippet-")
    assert not os.path.exists(folder), "its folder is removed afterwards"
