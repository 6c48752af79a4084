"""The code runner's subprocess: the output convention, tracebacks, the time and memory limits."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from composer.code_runner import SnippetResult, run_snippet


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


def test_a_snippet_that_forks_a_sleeper_is_killed_with_its_group() -> None:
    code = "import subprocess, sys\np = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\nprint(p.pid, flush=True)\nwhile True: pass"
    outcome = run(code, time_limit=1.5)
    assert outcome.code == "TIMEOUT"
    child = int(outcome.stderr.split()[0])
    time.sleep(0.2)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """True if the process exists and is not a zombie (an orphan may wait unreaped in a container)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


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
