"""The order example's worker: the payments, inventory and shipping tasks.

Run alone (``python workers.py``) it serves until Ctrl-C / SIGTERM; run_order.py
starts it in-process for a one-command demo.
"""

from __future__ import annotations

import asyncio
import hashlib

from composer import NonRetryableError, TaskContext, Worker

# The server: COMPOSER_ADDRESS (host:port, http://host:port or https://host:port; default
# 127.0.0.1:7070) and COMPOSER_TOKEN, read by the Worker itself.
worker = Worker(slots=8)


@worker.task("payments", "charge")
async def charge(ctx: TaskContext) -> dict[str, object]:
    if ctx.input["amount"] <= 0:
        raise NonRetryableError("amount must be positive", code="BAD_AMOUNT")
    # ctx.task_id is the same for every attempt: the payment provider's idempotency key.
    charge_id = "ch_" + hashlib.sha256(ctx.task_id.encode()).hexdigest()[:12]
    ctx.logger.info("charged %s for order %s", ctx.input["amount"], ctx.input["order"])
    return {"id": charge_id, "amount": ctx.input["amount"]}


@worker.task("inventory", "reserve_stock")
def reserve_stock(ctx: TaskContext) -> dict[str, object]:  # sync handlers run in a thread pool
    return {"sku": ctx.input["sku"], "reserved": True, "charge": ctx.input["charge_id"]}


@worker.task("shipping", "ship")
async def ship(ctx: TaskContext) -> dict[str, object]:
    await asyncio.sleep(0.2)
    return {"tracking": f"TRK-{ctx.input['order']}", "sku": ctx.input["sku"]}


@worker.task("payments", "refund")
async def refund(ctx: TaskContext) -> dict[str, object]:
    return {"refunded": ctx.input["charge"]}


@worker.task("payments", "void")
async def void(ctx: TaskContext) -> dict[str, object]:
    return {"voided": ctx.input["charge"]}


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    worker.run()
