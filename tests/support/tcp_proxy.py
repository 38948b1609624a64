#!/usr/bin/env python3
"""A TCP proxy on 127.0.0.1 that can start dropping what passes through it (tests of a host whose network
to the database fails).

    tcp_proxy.py TARGET_PORT

Listens on a free port of 127.0.0.1 and prints it ("port N") on stdout once ready. Every connection is
forwarded to 127.0.0.1:TARGET_PORT. SIGUSR1: drop — the connections stay open, but what either side sends
is read and thrown away (as packets lost on the way: the sender never gets an answer, nor an error); new
connections are accepted and dropped alike. SIGUSR2: forward again (connections made while dropping are
still useless: their first bytes were lost, as they would be). SIGTERM ends it.
"""
import asyncio
import signal
import sys

DROP = False


async def pump(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            if not DROP:
                writer.write(data)
                await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def handle(client_r, client_w, target):
    try:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", target)
    except OSError:
        client_w.close()
        return
    await asyncio.gather(pump(client_r, server_w), pump(server_r, client_w))


def set_drop(on):
    global DROP
    DROP = on
    print("drop" if on else "forward", flush=True)


async def main():
    target = int(sys.argv[1])
    server = await asyncio.start_server(lambda r, w: handle(r, w, target), "127.0.0.1", 0)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, set_drop, True)
    loop.add_signal_handler(signal.SIGUSR2, set_drop, False)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print(f"port {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
