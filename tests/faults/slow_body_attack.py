"""The attacker of ``test_slow_bodies`` in its own process (so its hundreds of sockets do not slow
the test's debug-mode event loop): ``python -m tests.faults.slow_body_attack PORT COUNT SECONDS``.
Each of COUNT connections sends a complete request head announcing a large body, then a byte a
second; when the gateway answers or closes, it connects again after a pause, until SECONDS have
passed. Prints one JSON line: the most connections trickling at once and the answers seen."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time

HEAD = (b"POST /hooks/gh HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n{")  # fmt: skip


class Attack:
    def __init__(self, port: int, deadline: float) -> None:
        self.port = port
        self.deadline = deadline
        self.held = 0
        self.peak = 0
        self.answers: dict[str, int] = {}

    async def one(self) -> None:
        while time.monotonic() < self.deadline:
            writer = None
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.write(HEAD)
                await writer.drain()
                self.held += 1
                self.peak = max(self.peak, self.held)
                try:
                    await self.trickle(reader, writer)
                finally:
                    self.held -= 1
            except OSError as exc:
                self.count(type(exc).__name__)
            finally:
                if writer is not None:
                    writer.close()
            await asyncio.sleep(1.0)

    async def trickle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while time.monotonic() < self.deadline:
            with contextlib.suppress(TimeoutError):
                answer = await asyncio.wait_for(reader.read(1024), 1.0)
                self.count(answer[:12].decode(errors="replace") if answer else "closed")
                return
            writer.write(b" ")
            await writer.drain()

    def count(self, what: str) -> None:
        self.answers[what] = self.answers.get(what, 0) + 1


async def main(port: int, count: int, seconds: float) -> None:
    attack = Attack(port, time.monotonic() + seconds)
    tasks = [asyncio.create_task(attack.one()) for _ in range(count)]
    await asyncio.gather(*tasks)
    print(json.dumps({"peak": attack.peak, "answers": attack.answers}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])))
