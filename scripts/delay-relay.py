#!/usr/bin/env python3
"""A userspace delay relay, for WAN figures on a machine without netem.

usage: delay-relay.py LISTEN_HOST:PORT TARGET_HOST:PORT RTT_MS

Listens on LISTEN; for each connection it opens one to TARGET, waits one round trip (the
far TCP handshake a real client would wait for), then relays bytes both ways, each chunk
released RTT/2 after it arrived: every exchange across it costs one more RTT, as over a
real path of that round-trip time, with the order kept and throughput not capped. An end
of stream is passed on, delayed the same. Prints `{"event": "listening", "port": N}` and
then `ready` once it listens (LISTEN's port may be 0: the line says which it got). Standard
library only; it runs until killed.
"""

import asyncio
import sys


async def pump(reader, writer, delay):
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()

    async def release():
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                try:
                    writer.write_eof()
                except (OSError, RuntimeError):
                    pass
                return
            writer.write(data)
            await writer.drain()

    releaser = asyncio.create_task(release())
    try:
        while True:
            data = await reader.read(65536)
            await queue.put((loop.time() + delay, data))
            if not data:
                break
        await releaser
    except (ConnectionError, OSError):
        releaser.cancel()


async def main():
    listen, target, rtt_ms = sys.argv[1], sys.argv[2], float(sys.argv[3])
    rtt = rtt_ms / 1000
    target_host, target_port = target.rsplit(":", 1)

    async def handle(client_reader, client_writer):
        try:
            origin_reader, origin_writer = await asyncio.open_connection(target_host, int(target_port))
        except OSError:
            client_writer.close()
            return
        await asyncio.sleep(rtt)
        await asyncio.gather(pump(client_reader, origin_writer, rtt / 2), pump(origin_reader, client_writer, rtt / 2))
        for writer in (client_writer, origin_writer):
            writer.close()

    host, port = listen.rsplit(":", 1)
    server = await asyncio.start_server(handle, host, int(port), backlog=1024)
    print('{"event": "listening", "port": %d}' % server.sockets[0].getsockname()[1], flush=True)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
