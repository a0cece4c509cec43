#!/usr/bin/env python3
"""A TLS-terminating TCP relay that makes a local server look far away.

Usage: wan-relay.py --cert PEM --key PEM --route LISTEN=UPSTREAM/DELAY_MS ...

Each route listens on LISTEN (host:port) with TLS (the certificate and key
given), and relays every connection in plain TCP to UPSTREAM (host:port).
Every chunk of bytes, in each direction, is delivered DELAY_MS after it
arrived, so a round trip costs 2 x DELAY_MS while throughput stays that of
the link (chunks are queued with their deadline, not slept on one by one):
what a registry some tens of milliseconds away over TLS looks like to a
client. The TLS handshake pays the delay too, as it would over a WAN.

Used by bench/registry.sh; standard library only.
"""

import argparse
import asyncio
import signal
import ssl
import sys
import time


def parse_route(text):
    """LISTEN=UPSTREAM/DELAY_MS -> ((host, port), (host, port), seconds)."""
    try:
        listen, rest = text.split("=", 1)
        upstream, delay = rest.rsplit("/", 1)
        lhost, lport = listen.rsplit(":", 1)
        uhost, uport = upstream.rsplit(":", 1)
        return (lhost, int(lport)), (uhost, int(uport)), float(delay) / 1000.0
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"route '{text}' is not LISTEN_HOST:PORT=UPSTREAM_HOST:PORT/DELAY_MS")


async def delayed_pipe(reader, writer, delay):
    """Copies reader to writer, each chunk delivered `delay` s after it came."""
    queue = asyncio.Queue()

    async def receive():
        while True:
            chunk = await reader.read(65536)
            await queue.put((time.monotonic() + delay, chunk))
            if not chunk:
                return

    async def deliver():
        while True:
            deadline, chunk = await queue.get()
            wait = deadline - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not chunk:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(chunk)
            await writer.drain()

    try:
        await asyncio.gather(receive(), deliver())
    except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


def make_handler(listen_port, upstream, delay):
    async def handle(client_reader, client_writer):
        # One line per connection, for counting who connects (bench/registry.sh).
        peer = client_writer.get_extra_info("peername")
        print(f"connect {listen_port} {peer[0]}", flush=True)
        # The handshake already happened; pay one round trip for it, as the
        # TCP and TLS handshakes cost at least that over a real link.
        await asyncio.sleep(2 * delay)
        try:
            up_reader, up_writer = await asyncio.open_connection(*upstream)
        except OSError as err:
            print(f"wan-relay: cannot reach {upstream[0]}:{upstream[1]}: {err}", file=sys.stderr)
            client_writer.close()
            return
        await asyncio.gather(
            delayed_pipe(client_reader, up_writer, delay),
            delayed_pipe(up_reader, client_writer, delay),
        )

    return handle


async def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cert", required=True, help="server certificate chain (PEM)")
    parser.add_argument("--key", required=True, help="server key (PEM)")
    parser.add_argument("--route", action="append", type=parse_route, required=True,
                        help="LISTEN_HOST:PORT=UPSTREAM_HOST:PORT/DELAY_MS (repeatable)")
    args = parser.parse_args()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(args.cert, args.key)
    servers = []
    for listen, upstream, delay in args.route:
        server = await asyncio.start_server(make_handler(listen[1], upstream, delay), *listen, ssl=context)
        servers.append(server)
        print(f"wan-relay: https://{listen[0]}:{listen[1]} -> {upstream[0]}:{upstream[1]}, "
              f"{delay * 1000:.0f} ms each way", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for server in servers:
        server.close()


if __name__ == "__main__":
    asyncio.run(main())
