"""One command: start the order worker, register order.yaml, run an order, approve it, print the output.

    composer dev                      # in another terminal (or already running)
    python examples/python/run_order.py
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import uuid
from pathlib import Path

from workers import worker

from composer import Client

HERE = Path(__file__).resolve().parent


async def main() -> int:
    serving = asyncio.create_task(worker.serve())
    try:
        async with Client() as client:  # COMPOSER_ADDRESS and COMPOSER_TOKEN, as the worker
            workflow = await client.register_workflow(HERE / "order.yaml")
            print(f"registered {workflow.name} v{workflow.version}")
            order_id = f"A-{uuid.uuid4().hex[:6]}"
            run = await client.start_run(
                workflow.name, {"order_id": order_id, "amount": 12.5, "sku": "BOOK-1"}, idempotency_key=order_id
            )
            print(f"started run {run.run_id} for order {order_id}")
            # An event sent before the run reaches its WAIT_FOR_EVENT is kept until it does.
            await client.send_event("approval", {"ok": True}, run_id=run.run_id)
            print("sent approval")
            output = await client.wait_for_result(run.run_id, timeout=60)
            print(json.dumps(output, indent=2))
            return 0
    finally:
        worker.stop()
        await serving


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(asyncio.run(main()))
