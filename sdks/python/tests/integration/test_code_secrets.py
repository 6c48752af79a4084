"""CODE nodes that name secrets, run by the SDK's code runner against the real server (docs/secrets.md).

The session's servers are given a secrets key (conftest.py, ``secrets_key_file``). Each test
acts in a namespace of its own (a token minted for it): its secrets and its ``code.python``
queue are the test's alone.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import uuid
from typing import Any

from _support import FAST, POLL_WAIT, final, serving
from conftest import ServerProcess, mint_token

from composer import Client, RunStatus, Worker


def run(coroutine: Any) -> None:
    asyncio.run(asyncio.wait_for(coroutine, 180))


def signing_workflow(names: str) -> str:
    """``sign`` names the secret ``k`` and echoes it; ``peek``, after it, names none and looks for it."""
    return f"""
name: sign_{names}
nodes:
  - id: sign
    type: CODE
    language: python
    secrets: [k]
    input: {{ payload: "${{input.payload}}" }}
    code: |
      import hashlib, hmac
      key = input["secrets"]["k"]
      result = {{
          "hmac": hmac.new(key.encode(), input["payload"].encode(), hashlib.sha256).hexdigest(),
          "length": len(key),
          "names": sorted(input["secrets"]),
          "echo": key,
      }}
  - id: peek
    type: CODE
    language: python
    input: {{ payload: "${{input.payload}}" }}
    code: |
      import os
      def read(path):
          try:
              with open(path, "rb") as file:
                  return file.read().decode(errors="replace")
          except OSError as error:
              return "unreadable: " + type(error).__name__
      {{
          "secrets": input.get("secrets"),
          "input": input,
          "environ": dict(os.environ),
          "proc_environ": read("/proc/self/environ"),
      }}
edges:
  - {{ from: sign, to: peek }}
output: {{ sign: "${{nodes.sign.output}}", peek: "${{nodes.peek.output}}" }}
"""


def test_a_code_node_gets_its_declared_secret_and_reports_it_redacted(server: ServerProcess, names: str) -> None:
    token = mint_token("admin", namespace=f"code-secrets-{names}")
    value = f"whsec_{uuid.uuid4().hex}"
    payload = f"order-{names}"

    async def main() -> None:
        worker = Worker(server.address, token=token, slots=2, backoff=FAST, poll_wait=POLL_WAIT)
        worker.serve_code(time_limit=20.0)
        async with Client(server.address, token=token) as client, serving(worker):
            await client.set_secret("k", value)
            await client.register_workflow(signing_workflow(names))
            started = await client.start_run(f"sign_{names}", {"payload": payload})
            ended = await final(client, started.run_id, 90)
            history = [event async for event in client.get_run_history(started.run_id)]
        assert ended.status is RunStatus.COMPLETED, ended
        assert ended.output is not None
        expected = hmac.new(value.encode(), payload.encode(), hashlib.sha256).hexdigest()
        assert ended.output["sign"] == {"hmac": expected, "length": len(value), "names": ["k"], "echo": "[secret k]"}
        peek = ended.output["peek"]
        assert peek["secrets"] is None and peek["input"] == {"payload": payload}, "a node that names no secret gets none"
        shown = json.dumps(peek)
        assert value not in shown and "[secret" not in shown, peek
        # The value is nowhere the run is kept: its nodes, its history, the server's log.
        for kept in (repr(ended), repr(history)):
            assert value not in kept
        assert value not in server.log_path.read_text(errors="replace"), "the server logged the value"

    run(main())


def test_a_code_node_whose_secret_is_not_set_fails_with_secret_unavailable(server: ServerProcess, names: str) -> None:
    token = mint_token("admin", namespace=f"code-secrets-{names}")
    unset = f"""
name: unset_{names}
nodes:
  - id: sign
    type: CODE
    language: python
    secrets: [never_set]
    retry: {{ max_attempts: 1 }}
    code: |
      input["secrets"]["never_set"]
"""
    listed = f"""
name: listed_{names}
nodes:
  - id: sign
    type: CODE
    language: python
    secrets: [k]
    input: [1, 2]
    code: |
      input
"""

    async def main() -> None:
        worker = Worker(server.address, token=token, slots=2, backoff=FAST, poll_wait=POLL_WAIT)
        worker.serve_code(time_limit=20.0)
        async with Client(server.address, token=token) as client, serving(worker):
            # Another secret is set, so the namespace has a key: it is `never_set` that is missing.
            await client.set_secret("k", f"v-{uuid.uuid4().hex}")
            await client.register_workflow(unset)
            started = await client.start_run(f"unset_{names}")
            ended = await final(client, started.run_id, 90)
            assert worker.stats.polled == 0, "the server fails the attempt itself: no runner gets the task"
            await client.register_workflow(listed)
            refused = await final(client, (await client.start_run(f"listed_{names}")).run_id, 90)
        assert ended.status is RunStatus.FAILED, ended
        node = ended.node("sign")
        assert node is not None and node.error is not None and node.attempt == 1, node
        assert node.error.code == "SECRET_UNAVAILABLE", node.error
        assert "never_set" in node.error.message, node.error
        assert refused.status is RunStatus.FAILED, refused
        listed_node = refused.node("sign")
        assert listed_node is not None and listed_node.error is not None, listed_node
        assert listed_node.error.code == "SECRETS_NEED_OBJECT_INPUT" and listed_node.attempt == 1, listed_node.error

    run(main())
