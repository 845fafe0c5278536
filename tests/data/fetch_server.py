"""A loopback HTTP server (127.0.0.1 only) for the fetch tests, and small archives in the official layouts.

The server answers ``GET`` for the paths of the real URLs (so ``LRA_MIRROR=http://127.0.0.1:<port>``
maps every source onto it), honours ``Range: bytes=<n>-`` with 206 / 416 like a static file server, and
can misbehave on purpose: cut a response after a chosen byte once, send at most N bytes per response
and then close (a cut on every connection) or stall (block, sending nothing more, until the test ends:
the client's socket timeout fires, with no sleep in the test), or ignore Range. It records every
request. Archives: ``aclImdb_v1.tar.gz`` (built from the text tests' ``make_imdb``),
``cifar-10-binary.tar.gz`` (binary records) and an ``lra_release.gz`` with the release's nesting
(``lra_release/lra_release/...`` plus the stray outer copies of ``listops-1000`` and ``pathfinder128``).

    python -m tests.data.fetch_server --dir /tmp/mirror    # bigger fixtures, served until Ctrl-C
    python -m tests.data.fetch_server --bench-mb 200       # time a streamed release fetch over loopback
    python -m tests.data.fetch_server --stall-bytes 300000 # time the give-up on a stalling server, defaults
"""
from __future__ import annotations

import argparse
import gzip
import io
import re
import tarfile
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterable, Iterator, Optional
from urllib.parse import urlsplit

import numpy as np
from PIL import Image

from lra.data.fetch import SOURCES
from lra.data.listops import generate, write_tsv


@dataclass
class Served:
    files: dict[str, bytes]
    requests: list[tuple[str, Optional[str]]] = field(default_factory=list)  # (path, Range header)
    cut_once: dict[str, int] = field(default_factory=dict)                  # path -> close after this byte
    per_response: dict[str, int] = field(default_factory=dict)              # path -> at most this many bytes a response
    stall: bool = False                    # after per_response bytes: block until `unblock` instead of closing
    unblock: threading.Event = field(default_factory=threading.Event)       # set when the server stops
    ignore_range: bool = False


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # one response per connection, closed after it

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        state: Served = self.server.state  # type: ignore[attr-defined]
        rng = self.headers.get("Range")
        state.requests.append((self.path, rng))
        body = state.files.get(self.path)
        if body is None:
            self.send_error(404, "Not Found")
            return
        start = 0
        m = re.fullmatch(r"bytes=(\d+)-", rng or "")
        if m and not state.ignore_range:
            start = int(m.group(1))
            if start >= len(body):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(body) - start))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        cut = state.cut_once.pop(self.path, None)
        payload = body[start:] if cut is None or cut <= start else body[start:cut]
        limit = state.per_response.get(self.path)
        if limit is not None and limit < len(payload):
            payload = payload[:limit]
        self.wfile.write(payload)
        self.wfile.flush()
        if limit is not None and state.stall and len(payload) < len(body) - start:
            state.unblock.wait()  # a stall: the connection stays open and silent


@contextmanager
def serve(files: dict[str, bytes]) -> Iterator[tuple[str, Served]]:
    """``(http://127.0.0.1:<port>, state)`` while the block runs."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.state = Served(dict(files))  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.state  # type: ignore[attr-defined]
    finally:
        server.state.unblock.set()  # type: ignore[attr-defined]
        server.shutdown()
        server.server_close()
        thread.join()


def url_path(key: str) -> str:
    """The path part of source ``key``'s real URL: where the mirror serves it."""
    return urlsplit(SOURCES[key].url).path


def tar_gz(entries: Iterable[tuple[str, bytes] | tarfile.TarInfo], level: int = 9) -> bytes:
    """A gzip'd tar of ``(name, data)`` files (and ``TarInfo`` members written as they are: links,
    devices), byte-identical on every call (gzip mtime 0)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for entry in entries:
            if isinstance(entry, tarfile.TarInfo):
                tar.addfile(entry)
                continue
            name, data = entry
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), compresslevel=level, mtime=0)


def imdb_archive(n: int = 6) -> bytes:
    """``aclImdb_v1.tar.gz``: the text tests' fixture reviews under ``aclImdb/`` (plus unsup and README)."""
    from tests.data.test_data_text import make_imdb

    with tempfile.TemporaryDirectory() as tmp:
        root = make_imdb(Path(tmp), n=n)
        (root / "README").write_text("Large Movie Review Dataset v1.0 (fixture)\n")
        entries = [(f"aclImdb/{p.relative_to(root).as_posix()}", p.read_bytes())
                   for p in sorted(root.rglob("*")) if p.is_file()]
    return tar_gz(entries)


def cifar_archive(per_batch: int = 4, seed: int = 0) -> tuple[bytes, np.ndarray, np.ndarray]:
    """``cifar-10-binary.tar.gz``: 5 train batches and 1 test batch of ``per_batch`` images each, as
    ``<label><R plane><G plane><B plane>`` records. Returns the archive, the ``[6*per_batch, 32, 32, 3]``
    images and the labels, in file order."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (6 * per_batch, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, 6 * per_batch).astype(np.uint8)
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
    entries = [("cifar-10-batches-bin/batches.meta.txt", b"airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck\n")]
    for b, name in enumerate(names):
        part = slice(b * per_batch, (b + 1) * per_batch)
        planes = images[part].transpose(0, 3, 1, 2).reshape(per_batch, 3072)
        entries.append((f"cifar-10-batches-bin/{name}", np.concatenate([labels[part, None], planes], 1).tobytes()))
    entries.append(("cifar-10-batches-bin/readme.html", b"<html>fixture</html>"))
    return tar_gz(entries), images, labels.astype(np.int64)


def aan_tsv(rows: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    lines = [f"{i % 2}.0\tP{seed}-{i}\tQ{seed}-{i}\tdoc {'x' * int(rng.integers(5, 40))} \"{i}\"\tother {'y' * int(rng.integers(5, 40))}"
             for i in range(rows)]
    return ("\n".join(lines) + "\n").encode()


def listops_tsv(rows: int, seed: int) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.tsv"
        write_tsv(path, generate(rows, seed=seed, min_length=5, max_length=30, workers=1, chunk_draws=500))
        return path.read_bytes()


def pathfinder_folder(prefix: str, n: int, res: int, seed: int) -> list[tuple[str, bytes]]:
    """A release difficulty folder: PNGs under ``imgs/0`` and TEXT metadata (as in the release)."""
    rng = np.random.default_rng(seed)
    entries, lines = [], []
    for i in range(n):
        png = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (res, res), dtype=np.uint8)).save(png, format="PNG")
        entries.append((f"{prefix}imgs/0/sample_{i}.png", png.getvalue()))
        lines.append(f"imgs/0 sample_{i}.png {i} {i % 2} 1.0 14 4 2 0.5 1 1\n")
    entries.append((f"{prefix}metadata/0.npy", "".join(lines).encode()))
    return entries


def release_archive(aan_rows: int = 24, listops_rows: int = 20, pathfinder_images: int = 12, filler: int = 0) -> bytes:
    """``lra_release.gz`` in the release's layout (google-research/long-range-arena#38): the real data
    under ``lra_release/lra_release/``, stray outer copies of ``listops-1000`` (one after the inner,
    with other rows) and ``pathfinder128`` (one before the inner), and members no task asks for;
    ``filler`` incompressible bytes in an unrequested member at the end (a stream that is still
    running after every wanted member has been unpacked)."""
    inner, outer = "lra_release/lra_release/", "lra_release/"
    entries = [(f"{outer}pathfinder128/curv_contour_length_14/metadata/0.npy", b"imgs/0 stray.png 0 1 1.0\n")]
    entries += [(f"{inner}listops-1000/{n}", listops_tsv(listops_rows, seed=i)) for i, n in
                enumerate(("basic_train.tsv", "basic_val.tsv", "basic_test.tsv"))]
    entries += [(f"{inner}tsv_data/new_aan_pairs.{s}.tsv", aan_tsv(aan_rows, seed=i)) for i, s in enumerate(("train", "eval", "test"))]
    entries += [(f"{inner}tsv_data/new_aan_pairs.train.only_ids.tsv", b"1\tP1\tP2\n")]
    entries += pathfinder_folder(f"{inner}pathfinder32/curv_baseline/", 4, 32, seed=1)
    entries += pathfinder_folder(f"{inner}pathfinder32/curv_contour_length_14/", pathfinder_images, 32, seed=2)
    entries += pathfinder_folder(f"{inner}pathfinder128/curv_contour_length_14/", 4, 128, seed=3)
    entries += [(f"{outer}listops-1000/{n}", listops_tsv(listops_rows, seed=9)) for n in ("basic_train.tsv", "basic_val.tsv", "basic_test.tsv")]
    if filler:
        entries.append((f"{inner}pathfinder256/curv_baseline/imgs/0/sample_0.png", np.random.default_rng(0).bytes(filler)))
    return tar_gz(entries)


def checksums_tsv(archives: dict[str, bytes]) -> str:
    """``url<TAB>size<TAB>sha256<TAB>name`` lines (tensorflow-datasets' format) for the fixture archives."""
    import hashlib

    return "".join(f"{SOURCES[k].url}\t{len(b)}\t{hashlib.sha256(b).hexdigest()}\t{SOURCES[k].filename}\n"
                   for k, b in archives.items())


def bench(megabytes: int, member_kb: int = 2) -> None:
    """Time ``fetch`` of task=retrieval from a streamed release-shaped archive whose bulk is
    ``megabytes`` of unrequested, incompressible ``member_kb`` KB members (like the release's PNGs)."""
    import hashlib
    import time

    from lra.data.download import Transfer
    from lra.data.fetch import FetchOptions, fetch, task_units

    rng = np.random.default_rng(0)
    n = megabytes * 1000 // member_kb
    bulk = ((f"lra_release/lra_release/pathfinder64/curv_baseline/imgs/{i // 1000}/sample_{i}.png", rng.bytes(member_kb * 1000))
            for i in range(n))
    small = release_archive()
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(small)), mode="r:") as t:
        wanted = [(m.name, t.extractfile(m).read()) for m in t.getmembers() if m.isfile()]
    t0 = time.perf_counter()
    blob = tar_gz([*wanted, *bulk], level=1)
    print(f"built {len(blob) / 1e6:.0f} MB ({n + len(wanted)} members) in {time.perf_counter() - t0:.0f} s", flush=True)
    with tempfile.TemporaryDirectory() as tmp, serve({url_path("lra_release"): blob}) as (base, _):
        sums = Path(tmp) / "sums.tsv"
        sums.write_text(f"{SOURCES['lra_release'].url}\t{len(blob)}\t{hashlib.sha256(blob).hexdigest()}\tx\n")
        opts = FetchOptions(data_dir=Path(tmp) / "data", checksums=sums, mirror=base, transfer=Transfer(retry_wait_s=0))
        t0 = time.perf_counter()
        fetch(task_units("retrieval", Path(tmp) / "data", {}), opts)
        took = time.perf_counter() - t0
    print(f"streamed fetch (verify + unpack 3 of {n + len(wanted)} members): {len(blob) / 1e6:.0f} MB in {took:.1f} s "
          f"= {len(blob) / 1e6 / took:.0f} MB/s, {(n + len(wanted)) / took:,.0f} members/s")


def stall_give_up(per_connection: int) -> None:
    """Time :func:`lra.data.download.download` with the default :class:`Transfer` (timeout, retries,
    wait) against a server that sends ``per_connection`` bytes on every connection and then stalls."""
    import hashlib
    import time

    from lra.data.download import Expected, Transfer, download

    blob = np.random.default_rng(0).bytes(max(8 * per_connection, 1 << 22))
    opts = Transfer()
    with tempfile.TemporaryDirectory() as tmp, serve({"/x.bin": blob}) as (base, state):
        state.per_response["/x.bin"], state.stall = per_connection, True
        opts.log = lambda line: print(f"{time.perf_counter() - t0:7.1f} s  {line}", flush=True)
        t0 = time.perf_counter()
        try:
            download(f"{base}/x.bin", Path(tmp) / "x.bin", Expected(len(blob), hashlib.sha256(blob).hexdigest(), "test"),
                     opts, "[stall]")
        except Exception as e:  # noqa: BLE001 - the give-up is what is timed
            took = time.perf_counter() - t0
            kept = (Path(tmp) / "x.bin.part").stat().st_size
            print(f"gave up after {took:.1f} s, {len(state.requests)} connections, {kept:,} bytes kept "
                  f"(timeout_s={opts.timeout_s:g}, retries={opts.retries}, retry_wait_s={opts.retry_wait_s:g}): {e}")
            return
    print("the download finished: the server did not stall long enough")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", help="writes the archives and checksums.tsv here")
    ap.add_argument("--bench-mb", type=int, default=0, help="instead: time a streamed fetch of this many MB")
    ap.add_argument("--stall-bytes", type=int, default=0,
                    help="instead: time the give-up (default settings) on a server that stalls after this many bytes")
    ap.add_argument("--reviews", type=int, default=100, help="IMDb reviews per label and split")
    ap.add_argument("--images", type=int, default=200, help="CIFAR images per batch file")
    ap.add_argument("--pairs", type=int, default=300, help="AAN pairs per split")
    args = ap.parse_args()
    if args.bench_mb:
        return bench(args.bench_mb)
    if args.stall_bytes:
        return stall_give_up(args.stall_bytes)
    if not args.dir:
        ap.error("--dir is required")
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    archives = {"imdb": imdb_archive(args.reviews), "cifar10": cifar_archive(args.images)[0],
                "lra_release": release_archive(aan_rows=args.pairs)}
    for key, data in archives.items():
        (out / SOURCES[key].filename).write_bytes(data)
    (out / "checksums.tsv").write_text(checksums_tsv(archives))
    with serve({url_path(k): b for k, b in archives.items()}) as (base, _):
        print(f"export LRA_MIRROR={base} LRA_CHECKSUMS={out / 'checksums.tsv'}", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
