"""The Python SDK's Worker with no-op handlers, for B1 (bench/loadgen).

Usage: python_worker.py HOST:PORT QUEUE SLOTS

Prints the number of tasks it completed (applied by the server) every 50 ms
on standard output, for the load generator's closed loop. SIGTERM drains and
stops.
"""

from __future__ import annotations

import sys
import threading
import time

from composer import TaskContext, Worker


def main() -> None:
    address, queue, slots = sys.argv[1], sys.argv[2], int(sys.argv[3])
    worker = Worker(address, slots=slots, poll_wait=1.0, drain_timeout=5.0)

    async def noop(ctx: TaskContext) -> dict[str, object]:
        return {}

    for name in ("step1", "step2", "step3"):
        worker.register(queue, name, noop)

    def report() -> None:
        while True:
            print(worker.stats.completed, flush=True)
            time.sleep(0.05)

    threading.Thread(target=report, daemon=True).start()
    worker.run()


if __name__ == "__main__":
    main()
