"""Adds a fixed delay to every packet of an NFQUEUE queue: a link delay where netem is missing.

    ip netns exec NS python -m lab.delay --queue 0 --delay-ms 100

netem is not built into this machine's kernel (`tc qdisc add ... netem`: "Specified qdisc kind
is unknown"; no modprobe, no module tree), nor is fq, whose departure times a BPF program could
set. What it has is iptables' NFQUEUE target: the kernel hands each packet to a process and
holds it until the process gives its verdict. This process accepts each packet `--delay-ms`
after it was queued, in arrival order, so the link behaves as one that is that much longer
(testbed.py's `delay` queues what the task sends and what it receives: the delay each way).
A pure-Python nfnetlink_queue client (no libnetfilter_queue); packets are not copied, only
their ids (NFQNL_COPY_META), and GSO packets are taken whole (NFQA_CFG_F_GSO).

It prints "ready" once bound. It ends on SIGTERM or when its stdin closes (its creator died);
packets still queued are then dropped by the kernel, as a cut link would.
"""

from __future__ import annotations

import argparse
import collections
import os
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_CFG_F_GSO = 1 << 2
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NF_ACCEPT = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
QUEUE_MAXLEN = 100_000  # packets held at once; the kernel drops beyond it


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def _message(msg: int, queue: int, attrs: bytes, flags: int = NLM_F_REQUEST) -> bytes:
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(queue)) + attrs
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg, flags, 0,
                       0) + body


def _attrs(data: bytes):
    while len(data) >= 4:
        length, kind = struct.unpack_from("=HH", data)
        if length < 4:
            return
        yield kind & 0x7FFF, data[4:length]
        data = data[(length + 3) & ~3:]


def bind(queue: int) -> socket.socket:
    """A netlink socket bound to NFQUEUE `queue`, packets' metadata only, GSO whole."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind((0, 0))
    for attrs in (_attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, 0)),
                  _attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META)),
                  _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", QUEUE_MAXLEN)),
                  _attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_GSO))
                  + _attr(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_GSO))):
        sock.send(_message(NFQNL_MSG_CONFIG, queue, attrs, NLM_F_REQUEST | NLM_F_ACK))
        reply = sock.recv(65536)
        kind, = struct.unpack_from("=H", reply, 4)
        error, = struct.unpack_from("=i", reply, 16) if kind == NLMSG_ERROR else (0,)
        if error:
            raise OSError(-error, f"NFQUEUE {queue} configuration: {os.strerror(-error)}")
    return sock


def serve(sock: socket.socket, queue: int, delay: float, stop) -> None:
    """Accepts each queued packet `delay` s after it arrived, until stop() is true."""
    held: collections.deque = collections.deque()  # (due, packet id), in arrival order
    while not stop():
        wait = max(0.0, held[0][0] - time.monotonic()) if held else 0.5
        ready, _, _ = select.select([sock, sys.stdin], [], [], wait)
        if sys.stdin in ready and not sys.stdin.buffer.read1(4096):
            return  # the creator is gone
        if sock in ready:
            try:
                data = sock.recv(1 << 20)
            except OSError:  # ENOBUFS: the kernel dropped some; they count as lost
                data = b""
            now = time.monotonic()
            while len(data) >= 16:
                length, kind = struct.unpack_from("=IH", data)
                if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                    for attr, payload in _attrs(data[20:length]):
                        if attr == NFQA_PACKET_HDR:
                            held.append((now + delay, struct.unpack_from("!I", payload)[0]))
                data = data[(length + 3) & ~3:]
        now = time.monotonic()
        while held and held[0][0] <= now:
            _, packet = held.popleft()
            sock.send(_message(NFQNL_MSG_VERDICT, queue, _attr(
                NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet))))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.delay",
                                description="Delay every packet of an NFQUEUE queue.")
    p.add_argument("--queue", type=int, default=0, help="the NFQUEUE number (default: 0)")
    p.add_argument("--delay-ms", type=float, required=True, help="added to every packet")
    args = p.parse_args(argv)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    try:
        sock = bind(args.queue)
    except OSError as e:
        print(f"error: {e}", flush=True)
        return 2
    print("ready", flush=True)
    serve(sock, args.queue, args.delay_ms / 1000, lambda: bool(stopping))
    return 0


if __name__ == "__main__":
    sys.exit(main())
