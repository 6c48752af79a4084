"""The code runner's subprocess: the output convention, tracebacks, the time and memory limits."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import tempfile
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


# Secrets a CODE node declares (docs/secrets.md): in the snippet's input, nowhere else, and
# redacted from everything the runner reports.

_READ_OWN_PROCESS = """
import os, sys
def read(path):
    try:
        with open(path, "rb") as file:
            return file.read().decode(errors="replace")
    except OSError as error:
        return "unreadable: " + type(error).__name__
"""


def _secret() -> str:
    return f"sk_test_{uuid.uuid4().hex}"


def test_declared_secrets_are_in_the_snippets_input_and_redacted_from_its_output() -> None:
    value, other = _secret(), _secret()
    code = (
        "key = input['secrets']['signing_key']\n"
        "result = {'names': sorted(input['secrets']), 'payload': input['payload'], 'length': len(key),\n"
        "          'echo': key, key: ['prefix ' + key + ' suffix', {'deep': [input['secrets']['other']]}]}"
    )
    outcome = run(code, {"payload": "p"}, secrets={"signing_key": value, "other": other})
    assert outcome.ok, outcome
    assert outcome.output == {
        "names": ["other", "signing_key"],
        "payload": "p",
        "length": len(value),
        "echo": "[secret signing_key]",
        "[secret signing_key]": ["prefix [secret signing_key] suffix", {"deep": ["[secret other]"]}],
    }
    absent = run("input", None, secrets={"k": value})
    assert absent.ok and absent.output == {"secrets": {"k": "[secret k]"}}, "a node without input gets {} plus secrets"
    empty = run("input", {}, secrets={})
    assert empty.ok and empty.output == {"secrets": {}}


def test_a_node_that_declares_secrets_needs_an_object_input() -> None:
    value = _secret()
    for input, kind in (([1, 2], "a list"), ("text", "a string"), (7, "a number"), (True, "a boolean")):
        outcome = run("input", input, secrets={"k": value})
        assert not outcome.ok and outcome.code == "SECRETS_NEED_OBJECT_INPUT" and not outcome.retryable, outcome
        assert f"must be an object (or absent), not {kind}" in outcome.message, outcome.message
        assert value not in repr(outcome)


def test_a_snippet_that_declares_no_secrets_gets_no_secrets_key() -> None:
    outcome = run("['secrets' in input, input]", {"n": 1})
    assert outcome.ok and outcome.output == [False, {"n": 1}]
    listed = run("input", [1, 2])
    assert listed.ok and listed.output == [1, 2], "without secrets any input goes as it is"


def test_secrets_are_redacted_from_a_failure_its_traceback_and_its_output_tail() -> None:
    value = _secret()
    code = (
        "import sys\n"
        "key = input['secrets']['k']\n"
        "print('printed', key)\n"
        # The value across the cut of the stderr tail: redacting after the cut would leave its end.
        f"sys.stderr.write(key + 'y' * {_code_handler._STDERR_TAIL - 10})\n"
        "def check(k):\n"
        "    raise ValueError('bad key ' + k)\n"
        "check(key)"
    )
    outcome = run(code, {}, secrets={"k": value})
    assert not outcome.ok and outcome.code == "CODE_ERROR", outcome
    assert outcome.message == "ValueError: bad key [secret k]"
    assert outcome.details["message"] == outcome.message
    assert "ValueError: bad key [secret k]" in outcome.details["traceback"]
    assert "printed [secret k]" in outcome.stderr
    assert value not in repr(outcome)
    assert value[-10:] not in outcome.details["stderr"], "no piece of the value survives the tail's cut"
    # As Python quotes it: a KeyError's message is the repr of its key.
    quoted = "it's a \"secret\"\nwith\ttabs " + uuid.uuid4().hex
    escaped = run("raise KeyError(input['secrets']['q'])", {}, secrets={"q": quoted})
    assert escaped.message == "KeyError: '[secret q]'", escaped.message
    assert repr(quoted)[1:-1] not in repr(escaped) and quoted not in repr(escaped)
    # An output that is not JSON says why without the value.
    invalid = run("result = {input['secrets']['k']}", {}, secrets={"k": value})
    assert invalid.code == "INVALID_OUTPUT" and value not in repr(invalid)


def test_redaction_replaces_the_longest_value_first_and_never_rewrites_a_replacement() -> None:
    short = uuid.uuid4().hex
    redactor = _code_handler.Redactor({"short": short, "long": short + "-and-more", "word": "secret"})
    assert redactor.text(f"{short}-and-more {short} a secret") == "[secret long] [secret short] a [secret word]"
    assert redactor.value({short: [short, 1, None, {"x": "secret"}]}) == {
        "[secret short]": ["[secret short]", 1, None, {"x": "[secret word]"}]
    }
    assert short not in repr(redactor) and repr(redactor) == "Redactor(['long', 'short', 'word'])"
    nothing = _code_handler.Redactor({})
    assert nothing.text("as it is") == "as it is" and nothing.value({"a": ["b"]}) == {"a": ["b"]}


def test_secret_values_never_reach_the_snippets_environment_argv_or_files(monkeypatch: pytest.MonkeyPatch) -> None:
    value = _secret()
    spawned: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    spawn = asyncio.create_subprocess_exec

    async def recording(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        spawned.append((args, kwargs))
        return await spawn(*args, **kwargs)

    monkeypatch.setattr(asyncio, "create_subprocess_exec", recording)
    before = set(os.listdir(tempfile.gettempdir()))
    code = _READ_OWN_PROCESS + (
        "result = {'environ': dict(os.environ), 'proc_environ': read('/proc/self/environ'),\n"
        "          'argv': sys.argv, 'cmdline': read('/proc/self/cmdline'),\n"
        "          'pid1_environ': read('/proc/1/environ'), 'pid1_cmdline': read('/proc/1/cmdline'),\n"
        "          'tmp': os.listdir('/tmp'), 'cwd': os.listdir('.')}"
    )
    outcome = run(code, {}, secrets={"k": value})
    assert outcome.ok, outcome
    shown = json.dumps(outcome.output)
    # Were the value anywhere there, redaction would show [secret k]: neither may appear.
    assert value not in shown and "[secret" not in shown, outcome.output
    [(argv, options)] = spawned
    assert not any(value in str(arg) for arg in argv), "the value is not on the child's command line"
    assert options["env"] == {}, "the child's environment is empty"
    assert value not in json.dumps(dict(os.environ))
    for entry in set(os.listdir(tempfile.gettempdir())) - before:
        path = os.path.join(tempfile.gettempdir(), entry)
        if os.path.isfile(path):
            with open(path, "rb") as file:
                assert value.encode() not in file.read(), f"{path} holds the value"
