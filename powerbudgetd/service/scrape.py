"""One bounded HTTP GET of the daemon's ``/metrics``, for ``powerbudgetd status``.

The server at the other end is not trusted: it may stream without end, answer one
byte at a time, redirect elsewhere, or not be the daemon at all (any local user can
listen on its port while it is down). So the request is HTTP/1.0 on a plain socket
(no keep-alive, no compression, no redirect followed) under one overall deadline
(connect, send and every read; s), and the answer is read up to a byte cap. A general
client (urllib) bounds each read, not the whole exchange, and follows redirects.

:func:`listener_trusted` says whether a local listener belongs to the daemon before
root believes it: the socket is held by the process holding the instance lock (its
PID from ``/proc/locks``), or owned by root.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from powerbudgetd.service.output import printable

MAX_HEAD_BYTES = 64 * 1024
# A scrape of a 64-card bank with every channel is about 200 kB; 16 MiB leaves room
# for any real daemon and bounds what a hostile server can make us hold.
MAX_BODY_BYTES = 16 * 1024 * 1024
RECV_BYTES = 64 * 1024
PROC = Path("/proc")


class ScrapeError(Exception):
    """The endpoint could not be read in full within the bounds; the message says why."""


@dataclass(frozen=True)
class Target:
    """An ``http://host:port/path`` URL split for a socket."""

    host: str
    port: int
    path: str

    @classmethod
    def parse(cls, url: str) -> Target:
        """Raises ScrapeError for anything but an ``http://`` URL with a host."""
        try:
            u = urllib.parse.urlsplit(url)
            port = u.port or 80
        except ValueError as exc:
            raise ScrapeError(f"{printable(url)} is not a URL: {exc}") from None
        if u.scheme != "http" or not u.hostname:
            raise ScrapeError(f"{printable(url)}: only http://HOST[:PORT]/PATH URLs are read")
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        return cls(u.hostname, port, path)


def get(url: str, deadline_s: float, max_body_bytes: int = MAX_BODY_BYTES) -> str:
    """The body of ``GET url`` (HTTP 200), decoded as UTF-8 (undecodable bytes replaced).

    ``deadline_s`` (s) bounds the whole exchange; at most ``max_body_bytes`` of body are
    read. Raises ScrapeError, naming the URL: unreachable, past the deadline, over the
    cap, not HTTP, a redirect (never followed: status names the URL it read), or any
    status but 200.
    """
    t = Target.parse(url)
    shown = printable(url)
    deadline = time.monotonic() + deadline_s

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ScrapeError(f"{shown} did not answer in full within {deadline_s:g} s")
        return remaining

    host = t.host if ":" not in t.host else f"[{t.host}]"
    request = (f"GET {t.path} HTTP/1.0\r\nHost: {host}:{t.port}\r\nAccept: text/plain\r\n"
               "Accept-Encoding: identity\r\nConnection: close\r\n\r\n").encode("ascii", "replace")
    limit = MAX_HEAD_BYTES + max_body_bytes
    buf = bytearray()
    try:
        with socket.create_connection((t.host, t.port), timeout=left()) as sock:
            sock.settimeout(left())
            sock.sendall(request)
            while True:
                sock.settimeout(left())
                chunk = sock.recv(RECV_BYTES)
                if not chunk:
                    break
                buf += chunk
                if len(buf) > limit:
                    raise ScrapeError(f"{shown} sent more than {max_body_bytes} bytes; not read further")
    except TimeoutError:
        raise ScrapeError(f"{shown} did not answer in full within {deadline_s:g} s") from None
    except OSError as exc:
        raise ScrapeError(f"cannot reach the daemon's metrics at {shown}: {printable(exc.strerror or exc)}") from None
    return _body(bytes(buf), shown, max_body_bytes)


def _body(raw: bytes, shown: str, max_body_bytes: int) -> str:
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep or len(head) > MAX_HEAD_BYTES:
        raise ScrapeError(f"{shown} did not answer with HTTP")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ScrapeError(f"{shown} did not answer with HTTP: {printable(lines[0][:80])}")
    code, reason = int(parts[1]), parts[2] if len(parts) > 2 else ""
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if 300 <= code < 400:
        where = printable(headers.get("location", "?")[:200])
        raise ScrapeError(f"{shown} answered HTTP {code}, a redirect to {where}: not followed "
                          "(status reads the daemon's own URL only)")
    if code != 200:
        raise ScrapeError(f"{shown} answered HTTP {code} {printable(reason[:80])}")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = _unchunk(body, shown)
    elif headers.get("content-length", "").isdigit():
        body = body[: int(headers["content-length"])]
    if len(body) > max_body_bytes:
        raise ScrapeError(f"{shown} sent more than {max_body_bytes} bytes; not read further")
    return body.decode("utf-8", "replace")


def _unchunk(body: bytes, shown: str) -> bytes:
    out = bytearray()
    pos = 0
    while True:
        end = body.find(b"\r\n", pos)
        size_text = body[pos:end].split(b";")[0].strip() if end >= 0 else b""
        try:
            size = int(size_text, 16)
        except ValueError:
            raise ScrapeError(f"{shown} sent a malformed chunked body") from None
        if size == 0:
            return bytes(out)
        out += body[end + 2: end + 2 + size]
        pos = end + 2 + size + 2


def is_local(host: str) -> bool:
    """``host`` is a loopback or this host's own address literal (a listener any local
    user could have bound)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host == "localhost"
    return ip.is_loopback or ip.is_unspecified or _is_own_address(ip)


def _is_own_address(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    try:
        with socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET) as s:
            s.bind((str(ip), 0))
        return True
    except OSError:
        return False


def listener_trusted(port: int, lock_file: Path, proc: Path = PROC) -> tuple[bool, str]:
    """Whether the TCP listener on ``port`` is the daemon's: held by the process holding
    ``lock_file`` (its flock in ``/proc/locks``), or owned by root (uid 0). Returns
    (trusted, why) where ``why`` names the listener's owner for the operator."""
    listeners = _listeners(port, proc)
    if not listeners:
        return False, f"nothing listens on port {port}"
    holder = lock_holder(lock_file, proc)
    if holder is not None:
        held = _socket_inodes(holder, proc)
        if any(inode in held for inode, _ in listeners):
            return True, f"held by the daemon (PID {holder}, holder of {lock_file})"
    if all(uid == 0 for _, uid in listeners):
        return True, "owned by root"
    uids = sorted({uid for _, uid in listeners})
    who = "no process holds it" if holder is None else f"PID {holder} holds it"
    return False, (f"the listener on port {port} is owned by uid {', '.join(map(str, uids))}, not by root, "
                   f"and not by the daemon ({lock_file}: {who})")


def lock_holder(lock_file: Path, proc: Path = PROC) -> int | None:
    """The PID holding an flock on ``lock_file`` (from ``/proc/locks``), else None."""
    try:
        st = lock_file.stat()
        text = (proc / "locks").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK" or fields[3] != "WRITE":
            continue
        dev_ino = fields[5].split(":")
        if len(dev_ino) != 3 or not fields[4].isdigit():
            continue
        try:
            major, minor, ino = int(dev_ino[0], 16), int(dev_ino[1], 16), int(dev_ino[2])
        except ValueError:
            continue
        if ino == st.st_ino and os.makedev(major, minor) == st.st_dev:
            return int(fields[4])
    return None


def _listeners(port: int, proc: Path) -> list[tuple[int, int]]:
    """(socket inode, owner uid) of each TCP socket listening on ``port``."""
    out = []
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) < 10 or f[3] != "0A":  # 0A: LISTEN
                continue
            if int(f[1].rsplit(":", 1)[1], 16) == port:
                out.append((int(f[9]), int(f[7])))
    return out


def _socket_inodes(pid: int, proc: Path) -> set[int]:
    inodes: set[int] = set()
    try:
        fds = list((proc / str(pid) / "fd").iterdir())
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes
