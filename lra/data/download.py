"""Getting one public archive over HTTP: resumable, verified, with progress a person can read.

* :func:`download` writes ``<dest>.part``. A cut or stalled connection is reopened with
  ``Range: bytes=<have>-`` and a later run appends to the ``.part`` the same way, so bytes already
  received are never fetched twice. Reads take what has arrived (``read1``), so a stall loses none of
  it. The transfer gives up after ``retries`` reconnects in a row that each brought less than
  ``min_progress`` (1 MiB) bytes: a server that stalls on every connection before sending that much
  is left after ``retries + 1`` timeouts, the bytes it sent kept (with the defaults measured at 371 s:
  ``python -m tests.data.fetch_server --stall-bytes 300000``); one that sends more each time is
  making progress and is followed.
  Size and sha256 are checked over the whole file, then ``os.replace`` puts it at ``dest``: ``dest``
  only ever holds a verified archive. A mismatch removes the ``.part`` (its bytes are wrong, resuming
  onto it cannot help) and nothing else; a full disk keeps it (the bytes on it are right).
* :class:`RangeStream` is the same reconnecting reader as a file object, for an archive that is
  unpacked while it arrives and never stored (the LRA release): :class:`Tally` counts and hashes
  what passes, so the caller verifies before it moves anything into place.
* :func:`mirrored`: ``LRA_MIRROR=http://host:port[/prefix]`` replaces the scheme and host of every
  URL (a local mirror for clusters whose compute nodes have no internet; the tests' loopback server).
* Progress: bytes, rate and ETA at most every 10 s (:class:`ByteProgress`).
* ``LRA_FETCH_INTERRUPT_AT=<n>`` (a test hook) raises ``KeyboardInterrupt`` once ``n`` bytes of a
  transfer are on disk, where a Ctrl-C would land, so an interrupted state is reproducible.
"""
from __future__ import annotations

import errno
import hashlib
import http.client
import io
import os
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional
from urllib.parse import urlsplit

from lra.badinput import BadInputError, DataMissingError, NotWritableError
from lra.data.progress import human

CHUNK = 1 << 20
MIRROR_ENV = "LRA_MIRROR"
INTERRUPT_ENV = "LRA_FETCH_INTERRUPT_AT"
USER_AGENT = "lra-suite-fetch/1 (python urllib)"
DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS, errno.EPERM)  # the disk, not the network


@dataclass(frozen=True)
class Expected:
    """What a verified archive must be; ``None`` = not known in advance. ``origin`` says where the
    numbers come from (printed, and written next to the prepared data)."""

    size: Optional[int]
    sha256: Optional[str]
    origin: str


@dataclass
class Transfer:
    """Options of every HTTP transfer of one fetch."""

    retries: int = 5            # reconnects in a row without progress, then give up
    retry_wait_s: float = 2.0
    timeout_s: float = 60.0     # socket timeout of one read
    min_progress: int = CHUNK   # bytes one connection must bring to count as progress (resets the count)
    every_s: float = 10.0       # progress lines at most this often
    log: Callable[[str], None] = print


def size_text(n: float) -> str:
    """``762 B``, ``84.1 MB``, ``170 MB``, ``7.74 GB`` (decimal units, as servers and ``ls --si`` count)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            v = n / scale
            return f"{v:.2f} {unit}" if v < 10 else f"{v:.1f} {unit}" if v < 100 else f"{v:.0f} {unit}"
    return f"{int(n)} B"


def mirrored(url: str, mirror: Optional[str] = None) -> str:
    """``url`` with its scheme and host replaced by the mirror's (``LRA_MIRROR`` by default); a path
    prefix of the mirror is kept before the original path."""
    mirror = os.environ.get(MIRROR_ENV) if mirror is None else mirror
    if not mirror:
        return url
    m, u = urlsplit(mirror), urlsplit(url)
    if not m.scheme or not m.netloc:
        raise DataMissingError(f"{MIRROR_ENV}={mirror!r} is not a URL; give scheme and host, e.g. {MIRROR_ENV}=http://10.0.0.5:8000")
    path = m.path.rstrip("/") + u.path
    return f"{m.scheme}://{m.netloc}{path}" + (f"?{u.query}" if u.query else "")


class ByteProgress:
    """``<label>: 1.2 GB of 7.7 GB (16%), 45 MB/s, eta 2m 30s`` at most every ``every_s`` seconds."""

    def __init__(self, label: str, total: Optional[int], start: int = 0, every_s: float = 10.0,
                 log: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic) -> None:
        self.label, self.total, self.start, self.every_s, self.log, self.clock = label, total, start, every_s, log, clock
        self.t0 = self.last = clock()
        self.done = start

    def _rate(self, now: float) -> float:
        return (self.done - self.start) / max(now - self.t0, 1e-9)

    def update(self, done: int) -> None:
        self.done = done
        now = self.clock()
        if now - self.last < self.every_s:
            return
        self.last = now
        rate = self._rate(now)
        if self.total:
            eta = f", eta {human((self.total - done) / rate)}" if rate > 0 else ""
            self.log(f"{self.label}: {size_text(done)} of {size_text(self.total)} ({100 * done / self.total:.0f}%), "
                     f"{size_text(rate)}/s{eta}")
        else:
            self.log(f"{self.label}: {size_text(done)}, {size_text(rate)}/s")

    def finish(self) -> None:
        now = self.clock()
        resumed = f" (resumed at {size_text(self.start)})" if self.start else ""
        self.log(f"{self.label}: {size_text(self.done)} in {human(now - self.t0)}, {size_text(self._rate(now))}/s{resumed}")


class _Cut(Exception):
    """The connection broke (or ended early): worth reconnecting with a Range request."""


def _interrupt_at() -> Optional[int]:
    value = os.environ.get(INTERRUPT_ENV)
    return int(value) if value else None


def _content_range(header: Optional[str]) -> tuple[Optional[int], Optional[int]]:
    """``bytes 100-199/1000`` -> (100, 1000); ``bytes */1000`` -> (None, 1000)."""
    m = re.match(r"bytes\s+(\d+|\*)(?:-\d+)?/(\d+|\*)", header or "")
    if not m:
        return None, None
    first, total = m.groups()
    return (None if first == "*" else int(first)), (None if total == "*" else int(total))


def _http_error(url: str, code: int, reason: str) -> DataMissingError:
    via = os.environ.get(MIRROR_ENV)
    where = (f" (through {MIRROR_ENV}={via}: does the mirror hold the file at that path?)" if via else "")
    return DataMissingError(
        f"HTTP {code} {reason} for {url}{where}. Nothing was put in place. If the file moved, download it by "
        f"another way and pass it with fetch.from=FILE (or put it in fetch.download_dir); a mirror is named "
        f"with {MIRROR_ENV}=http://host:port")


def open_range(url: str, offset: int, timeout_s: float):
    """GET ``url`` from byte ``offset``. Returns ``(response or None, first byte, total or None)``;
    ``first`` is 0 when the server ignored the Range header. A 4xx is a :class:`DataMissingError`;
    a network failure or a 5xx raises :class:`_Cut` (retried by the callers)."""
    headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    try:
        resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s)
    except urllib.error.HTTPError as e:
        if e.code == 416 and offset:  # nothing after `offset`: the server says how long the file is
            _, total = _content_range(e.headers.get("Content-Range"))
            e.close()
            return None, offset, total
        if e.code >= 500:
            raise _Cut(f"HTTP {e.code} {e.reason}") from e
        raise _http_error(url, e.code, str(e.reason)) from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
        raise _Cut(str(getattr(e, "reason", e))) from e
    if resp.status == 206:
        first, total = _content_range(resp.headers.get("Content-Range"))
        if first != offset:
            resp.close()
            raise DataMissingError(f"{url}: asked for bytes from {offset}, the server sent a range from {first}; "
                                   f"it does not resume correctly: delete the .part file and fetch again")
        return resp, first, total
    length = resp.headers.get("Content-Length")
    return resp, 0, int(length) if length and length.isdigit() else None


def _read(resp, n: int) -> bytes:
    """What has arrived, up to ``n`` bytes (``read1``: a timeout while waiting for more loses nothing)."""
    try:
        return resp.read1(n)
    except (http.client.HTTPException, OSError) as e:
        raise _Cut(str(e)) from e


def _give_up(url: str, have: int, total: Optional[int], why: str, part: Optional[Path]) -> DataMissingError:
    """``part``: the file the bytes went to (None: the archive was unpacked as it arrived)."""
    got = f"{size_text(have)}" + (f" of {size_text(total)}" if total else "")
    if part is None:
        keep = " (The archive was being unpacked as it arrived; nothing was put in place.)"
    elif have:
        keep = f" The {got} received are kept in {part}: run the same command again to resume from there."
    else:
        keep = " Nothing was received, so no partial file is kept; nothing was put in place."
    return DataMissingError(f"download of {url} failed after {got} ({why}).{keep} Check the network (or "
                            f"{MIRROR_ENV}), or fetch the file by another way and pass it with fetch.from=FILE")


class _Reconnects:
    """Failed connections in a row. One that brought ``min_progress`` bytes or more resets the count: a
    flaky but moving server goes on, while one that sends a little and stalls every time is given up
    after ``retries + 1`` connections (the bytes it sent are kept by the caller)."""

    def __init__(self, url: str, opts: Transfer, label: str, pos: int) -> None:
        self.url, self.opts, self.label, self.count, self.mark = url, opts, label, 0, pos

    def failed(self, pos: int, total: Optional[int], why: str, part: Optional[Path]) -> None:
        """Count a failure at byte ``pos``; wait and return, or raise the give-up error."""
        self.count = 1 if pos - self.mark >= self.opts.min_progress else self.count + 1
        self.mark = pos
        if self.count > self.opts.retries:
            raise _give_up(self.url, pos, total, why, part)
        self.opts.log(f"{self.label}: {why}; reconnecting ({self.count}/{self.opts.retries}) to resume at {size_text(pos)}")
        time.sleep(self.opts.retry_wait_s)


def _disk_full(e: OSError, part: Path, total: Optional[int]) -> NotWritableError:
    """The error of a ``.part`` that cannot be written: what is kept and which setting moves it."""
    have = part.stat().st_size if part.exists() else 0
    got = f"{size_text(have)}" + (f" of {size_text(total)}" if total else "")
    kept = (f"The {got} written are kept in it: run the same command then to resume from there" if have else
            "Nothing was written, so no partial file is kept")
    return NotWritableError(
        f"cannot write the download {part} ({e.strerror or e}). {kept}; nothing was put in place. Free space on "
        f"that disk (or make it writable), or point fetch.download_dir at another disk")


def check(url: str, expected: Expected, size: int, sha256: Optional[str], removed: Optional[Path] = None,
          local: bool = False) -> None:
    """Raise :class:`BadInputError` when ``size``/``sha256`` differ from what is expected
    (``sha256=None``: only the size is known yet). ``local``: ``url`` is a file the user gave."""
    problem = None
    if expected.size is not None and size != expected.size:
        problem = f"{size:,} bytes where {expected.size:,} are expected"
    elif expected.sha256 and sha256 is not None and sha256 != expected.sha256.lower():
        problem = f"sha256 {sha256} where {expected.sha256.lower()} is expected"
    if not problem:
        return
    if local:
        raise BadInputError(
            f"{url} failed verification: {problem} ({expected.origin}). It was left as it is and nothing was put in "
            f"place: it is not the original archive (or an incomplete copy); delete it, or pass the original "
            f"with fetch.from=FILE")
    gone = f" The download {removed} was removed;" if removed else ""
    raise BadInputError(
        f"{url} failed verification: {problem} ({expected.origin}).{gone} nothing was put in place and data "
        f"already there is untouched. Run the command again; if it fails again the server (or {MIRROR_ENV}) "
        f"serves a different file: get the original archive and pass it with fetch.from=FILE")


class _Part:
    """The ``.part`` file being appended to, with the sha256 of everything in it so far."""

    def __init__(self, path: Path, longest: Optional[int], log: Callable[[str], None]) -> None:
        self.path = path
        self.size = path.stat().st_size if path.exists() else 0
        if longest is not None and self.size > longest:
            log(f"{path} is longer than the archive ({self.size:,} > {longest:,} bytes): starting again")
            path.unlink()
            self.size = 0
        self.hasher = hashlib.sha256()
        if self.size:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(CHUNK), b""):
                    self.hasher.update(block)
        self.f = open(path, "ab")

    def restart(self) -> None:
        self.f.seek(0)
        self.f.truncate(0)
        self.hasher, self.size = hashlib.sha256(), 0

    def append(self, block: bytes) -> None:
        self.f.write(block)
        self.hasher.update(block)
        self.size += len(block)

    def close(self) -> None:
        try:
            self.f.flush()
            os.fsync(self.f.fileno())
        finally:
            self.f.close()


def _append_body(resp, part: _Part, stop: Optional[int], progress: ByteProgress) -> None:
    """Append the body of ``resp`` to ``part``; :class:`_Cut` if the connection breaks."""
    with resp:
        while True:
            block = _read(resp, CHUNK)
            if not block:
                return
            if stop is not None and part.size + len(block) >= stop:
                part.append(block[: stop - part.size])
                part.close()
                raise KeyboardInterrupt(f"stopped at byte {stop} ({INTERRUPT_ENV})")
            part.append(block)
            progress.update(part.size)


def download(url: str, dest: Path, expected: Expected, opts: Transfer, label: str) -> tuple[int, str]:
    """Download ``url`` to ``dest`` through ``dest.part`` (resumed when present); verified before the
    rename. Returns (size, sha256)."""
    dest = Path(dest)
    path = dest.with_name(dest.name + ".part")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = _Part(path, expected.size, opts.log)
    except OSError as e:
        if e.errno not in DISK_ERRORS:
            raise
        raise _disk_full(e, path, expected.size) from None
    total, stop = expected.size, _interrupt_at()
    reconnects = _Reconnects(url, opts, label, part.size)
    if part.size:
        opts.log(f"{label}: resuming {part.path} at {size_text(part.size)}")
    progress = ByteProgress(label, total, start=part.size, every_s=opts.every_s, log=opts.log)
    try:
        while total is None or part.size < total:
            try:
                resp, first, server_total = open_range(url, part.size, opts.timeout_s)
                if server_total is not None and total is not None and server_total != total:
                    if resp is not None:
                        resp.close()
                    check(url, expected, server_total, None)  # the server holds another file: raises
                total = progress.total = total if total is not None else server_total
                if resp is None:
                    break  # 416: the .part already holds every byte
                if first != part.size:  # the server ignored Range: start again from its first byte
                    opts.log(f"{label}: the server does not resume (no HTTP range support): starting again from byte 0")
                    part.restart()
                _append_body(resp, part, stop, progress)
                if total is None:
                    break  # no length announced: the end of the body is the end of the file
                if part.size < total:
                    raise _Cut(f"the connection closed at {part.size:,} of {total:,} bytes")
            except _Cut as e:
                reconnects.failed(part.size, total, str(e), part.path)
        part.close()
    except BaseException as e:
        if not part.f.closed:
            try:
                part.close()
            except OSError:
                pass  # the disk that failed the write fails this too; what reached the file is kept
        if part.path.exists() and part.path.stat().st_size == 0:  # nothing received: leave no empty .part
            part.path.unlink()
        if isinstance(e, OSError) and e.errno in DISK_ERRORS:
            raise _disk_full(e, part.path, total) from None
        raise
    progress.finish()
    size, digest = part.size, part.hasher.hexdigest()
    try:
        check(url, expected, size, digest, removed=part.path)
    except BadInputError:
        part.path.unlink()
        raise
    os.replace(part.path, dest)
    return size, digest


class Tally(io.RawIOBase):
    """A read-only file object that counts and hashes every byte read through it."""

    def __init__(self, raw: io.RawIOBase) -> None:
        self.raw, self.size, self.hasher = raw, 0, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self.raw.readinto(b)
        if n:
            self.hasher.update(memoryview(b)[:n])
            self.size += n
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()

    @property
    def sha256(self) -> str:
        return self.hasher.hexdigest()


class RangeStream(io.RawIOBase):
    """The body of ``url`` as a file object that reconnects with a Range request when the connection
    breaks, so a cut costs nothing but the reconnect. ``total`` comes from ``expected.size`` or the
    server's ``Content-Length``; reading stops there."""

    def __init__(self, url: str, expected: Expected, opts: Transfer, label: str) -> None:
        self.url, self.opts, self.label, self.pos = url, opts, label, 0
        self.reconnects = _Reconnects(url, opts, label, 0)
        self.total, self.origin = expected.size, expected.origin
        self.stop = _interrupt_at()
        self.resp = None
        self._connect()
        self.progress = ByteProgress(label, self.total, every_s=opts.every_s, log=opts.log)

    def _connect(self) -> None:
        """(Re)open the body at ``self.pos``; retried like a cut."""
        while True:
            try:
                resp, first, total = open_range(self.url, self.pos, self.opts.timeout_s)
                if total is not None and self.total is not None and total != self.total:
                    if resp is not None:
                        resp.close()
                    check(self.url, Expected(self.total, None, self.origin), total, None)
                if self.total is None:
                    self.total, self.origin = total, "the size the server announced at the first request"
                skip = self.pos - first if resp is not None else 0
                while skip:  # the server ignored Range: skip what was already read
                    block = _read(resp, min(CHUNK, skip))
                    if not block:
                        raise _Cut("the connection closed while skipping to the resume point")
                    skip -= len(block)
                self.resp = resp
                return
            except _Cut as e:
                self._failed(str(e))

    def _failed(self, why: str) -> None:
        self.reconnects.failed(self.pos, self.total, why, None)

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while True:
            if self.resp is None or (self.total is not None and self.pos >= self.total):
                return 0
            broken = None
            try:
                n = self.resp.readinto1(b)  # what has arrived: a stall loses none of it
            except (http.client.HTTPException, OSError) as e:
                n, broken = 0, str(e)
            if n > 0:
                if self.stop is not None and self.pos + n >= self.stop:
                    raise KeyboardInterrupt(f"stopped at byte {self.stop} ({INTERRUPT_ENV})")
                self.pos += n
                self.progress.update(self.pos)
                return n
            if broken is None and self.total is None:
                return 0  # no length announced: the end of the body is the end of the file
            self.resp.close()
            self.resp = None
            self._failed(broken or f"the connection closed at {self.pos:,} of {self.total:,} bytes")
            self._connect()

    def close(self) -> None:
        if self.resp is not None:
            self.resp.close()
            self.resp = None
        super().close()
