"""mode=fetch under real faults (issue 36), against the loopback server of tests/data/fetch_server.py
(127.0.0.1 only) or local files: stalls (the server blocks, the client's small socket timeout fires),
a full disk (a patched write raises ENOSPC at a chosen byte), Ctrl-C during a fetch.force replacement,
read-only data, failed tasks of a multi-task release fetch, links and absolute names, a second fetch
waiting on the lock; and the rules the planted bugs of the issue broke without a failing test."""
from __future__ import annotations

import errno
import fcntl
import gc
import gzip
import hashlib
import io
import os
import shutil
import signal
import socket
import tarfile
import threading
from pathlib import Path
from typing import Any

import pytest

from lra.badinput import BadInputError, DataMissingError, NotWritableError
from lra.data import archives as archives_mod
from lra.data import download as download_mod
from lra.data import fetch as fetch_mod
from lra.data import layout
from lra.data.download import Transfer
from lra.data.fetch import FetchOptions, fetch
from tests.data.fetch_server import checksums_tsv, tar_gz, url_path
from tests.data.test_fetch import _leftovers, _opts, _units, fixtures, server  # noqa: F401 - fixtures

STALL_S = 0.5  # the tests' socket timeout: what one stall costs


def _members(blob: bytes) -> list[tuple[str, bytes]]:
    """The files of a .tar.gz, in order."""
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob)), mode="r:") as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers() if m.isfile()]


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


class _FullDisk:
    """A file whose writes stop with ENOSPC once ``budget[0]`` bytes were written through all of them
    (the bytes before that point reach the file, as on a disk that fills up)."""

    def __init__(self, f: Any, budget: list[int]) -> None:
        self.f, self.budget = f, budget

    def write(self, data: bytes) -> int:
        room = self.budget[0]
        if len(data) > room:
            self.f.write(bytes(data[:room]))
            self.budget[0] = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.budget[0] -= len(data)
        return self.f.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)

    def __enter__(self) -> "_FullDisk":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.f.close()


def _fill_disk_at(monkeypatch, module: Any, at: int) -> None:
    """Every file ``module`` opens for writing shares one disk with ``at`` bytes free."""
    budget = [at]

    def full_open(path, mode="r", *args, **kwargs):
        f = open(path, mode, *args, **kwargs)
        return _FullDisk(f, budget) if any(c in mode for c in "wa+") else f

    monkeypatch.setattr(module, "open", full_open, raising=False)


# ----------------------------------------------------------------------------- 1. stalls
def test_a_stall_keeps_what_arrived_on_every_connection(tmp_path, server, fixtures):
    """The server sends a third of the file and stalls on every connection: each connection's bytes are
    kept (the next asks for the range after them), so the download and the streamed release complete."""
    base, state = server
    state.stall = True
    for key, task in (("imdb", "text"), ("lra_release", "retrieval")):
        size = len(fixtures["archives"][key])
        third = size // 3 + 1
        state.per_response[url_path(key)] = third
        state.requests.clear()
        opts = _opts(tmp_path, base, fixtures["archives"])
        opts.transfer.timeout_s = STALL_S
        fetch(_units(tmp_path, task), opts)
        assert state.requests == [(url_path(key), None), (url_path(key), f"bytes={third}-"),
                                  (url_path(key), f"bytes={2 * third}-")], key
    assert (tmp_path / "data" / "downloads" / "aclImdb_v1.tar.gz").read_bytes() == fixtures["archives"]["imdb"]
    assert (tmp_path / "data" / "lra_release" / "tsv_data" / "new_aan_pairs.test.tsv").is_file()


def test_a_server_that_stalls_every_time_is_given_up_with_its_bytes_kept(tmp_path, server, fixtures):
    """Less than fetch's min_progress per connection, then a stall: given up after retries + 1
    connections (bounded), and the bytes of every connection are kept in the .part for the next run."""
    base, state = server
    state.stall, state.per_response[url_path("imdb")] = True, 200
    opts = _opts(tmp_path, base, fixtures["archives"])
    opts.transfer.timeout_s, opts.transfer.retries = STALL_S, 1
    with pytest.raises(DataMissingError, match=r"failed after 400 B of .* kept in .*aclImdb_v1.tar.gz.part"):
        fetch(_units(tmp_path, "text"), opts)
    assert len(state.requests) == 2
    part = tmp_path / "data" / "downloads" / "aclImdb_v1.tar.gz.part"
    assert part.read_bytes() == fixtures["archives"]["imdb"][:400]


# ----------------------------------------------------------------------------- 2. full disk
def test_full_disk_while_downloading_is_an_error_and_the_bytes_are_kept(tmp_path, server, fixtures, monkeypatch, capsys):
    """ENOSPC at byte 500 of the .part: 'error:' and exit 2 (python -m lra.data.fetch, as run.py), the
    500 bytes kept; once there is room again the same command resumes from there."""
    base, state = server
    sums = tmp_path / "checksums.tsv"
    sums.write_text(checksums_tsv(fixtures["archives"]))
    monkeypatch.setenv("LRA_MIRROR", base)
    monkeypatch.setenv(fetch_mod.CHECKSUMS_ENV, str(sums))
    _fill_disk_at(monkeypatch, download_mod, 500)
    argv = ["text", "--data-dir", str(tmp_path / "data")]
    monkeypatch.setattr(gc, "freeze", lambda: None)  # exit_user_error's, which would freeze this test process
    with pytest.raises(SystemExit) as stopped:  # lra.badinput.exit_user_error
        fetch_mod.main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot write the download") and "\n" not in err and "No space left" in err
    assert "500 B of" in err and "kept" in err and "fetch.download_dir" in err
    part = tmp_path / "data" / "downloads" / "aclImdb_v1.tar.gz.part"
    assert part.read_bytes() == fixtures["archives"]["imdb"][:500] and not (tmp_path / "data" / "aclImdb").exists()
    monkeypatch.undo()
    monkeypatch.setenv("LRA_MIRROR", base)
    monkeypatch.setenv(fetch_mod.CHECKSUMS_ENV, str(sums))
    assert fetch_mod.main(argv) == 0
    assert state.requests[-1] == (url_path("imdb"), "bytes=500-") and (tmp_path / "data" / "aclImdb" / "test").is_dir()


def test_full_disk_while_converting_cifar_is_an_error(tmp_path, server, fixtures, monkeypatch, capsys):
    """ENOSPC in the middle of the first CIFAR-10 pickle: 'error:' naming the folder, exit 2, no image
    folder and no staging folder; the verified archive stays in downloads for the next run."""
    base, _ = server
    sums = tmp_path / "checksums.tsv"
    sums.write_text(checksums_tsv(fixtures["archives"]))
    monkeypatch.setenv("LRA_MIRROR", base)
    monkeypatch.setenv(fetch_mod.CHECKSUMS_ENV, str(sums))
    _fill_disk_at(monkeypatch, fetch_mod, 5000)
    monkeypatch.setattr(gc, "freeze", lambda: None)  # exit_user_error's, which would freeze this test process
    with pytest.raises(SystemExit) as stopped:  # lra.badinput.exit_user_error
        fetch_mod.main(["image", "--data-dir", str(tmp_path / "data")])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: cannot write the unpacked files under {tmp_path / 'data'}") and "\n" not in err
    assert "nothing was put in place" in err and "paths.data_dir" in err
    assert not (tmp_path / "data" / "cifar-10-batches-py").exists() and not _leftovers(tmp_path)
    assert (tmp_path / "data" / "downloads" / "cifar-10-binary.tar.gz").read_bytes() == fixtures["archives"]["cifar10"]


# ----------------------------------------------------------------------------- 3. Ctrl-C in a replacement
def test_ctrl_c_while_the_old_copy_is_removed(tmp_path, server, fixtures, monkeypatch):
    """fetch.force=true, Ctrl-C while the replaced folder is being deleted: the message says the new
    folder is in place and the old copy is left; the next fetch removes that copy."""
    base, _ = server
    old = tmp_path / "data" / "aclImdb"
    for part in ("train/neg", "train/pos", "test/neg", "test/pos"):
        (old / part).mkdir(parents=True)
    (old / "mine.txt").write_text("old")
    real_rmtree = shutil.rmtree

    def stopped_rmtree(path, *args, **kwargs):
        if ".replaced-" in Path(path).name:
            (Path(path) / "mine.txt").unlink()
            raise KeyboardInterrupt
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", stopped_rmtree)
    lines: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        fetch(_units(tmp_path, "text"), _opts(tmp_path, base, fixtures["archives"], lines, force=True))
    monkeypatch.undo()
    assert lines[-1].startswith("[fetch] interrupted after aclImdb_v1.tar.gz was put in place (text -> ")
    assert ".aclImdb.replaced-" in lines[-1] and "the next fetch removes them" in lines[-1]
    assert (old / ".fetched.json").is_file() and not (old / "mine.txt").exists()
    assert [p.split(".replaced-")[0] for p in _leftovers(tmp_path)] == ["data/.aclImdb"]
    lines.clear()
    fetch(_units(tmp_path, "text"), _opts(tmp_path, base, fixtures["archives"], lines))
    assert not _leftovers(tmp_path) and "already there" in lines[-1]
    assert any("removing" in line and ".aclImdb.replaced-" in line for line in lines)


def test_a_replacement_stopped_between_its_renames_is_undone(tmp_path, server, fixtures):
    """A fetch killed after renaming the old folder aside, before the new one took its place, left the
    old data as .<name>.replaced-<pid> only: the next fetch renames it back instead of deleting it."""
    base, state = server
    aside = tmp_path / "data" / "lra_release" / ".tsv_data.replaced-99999"
    aside.mkdir(parents=True)
    for name in layout.AAN.files:
        (aside / name).write_text("1\ta\tb\tx\ty\n")
    lines: list[str] = []
    fetch(_units(tmp_path, "retrieval"), _opts(tmp_path, base, fixtures["archives"], lines))
    assert state.requests == [] and not aside.exists() and "already there" in lines[-1]
    assert (tmp_path / "data" / "lra_release" / "tsv_data" / "new_aan_pairs.test.tsv").read_text() == "1\ta\tb\tx\ty\n"


def test_placing_is_all_or_none(tmp_path, monkeypatch):
    """A rename failing on the second folder puts the first back as it was (old copy included)."""
    ready = [tmp_path / "ready1", tmp_path / "ready2"]
    dests = [tmp_path / "a" / "one", tmp_path / "a" / "two"]
    for r in ready:
        r.mkdir()
        (r / "new").write_text("new")
    dests[0].mkdir(parents=True)
    (dests[0] / "old").write_text("old")
    real_rename = os.rename

    def failing_rename(src, dst):
        if Path(src) == ready[1]:
            raise OSError(errno.EACCES, "Permission denied", str(dst))
        return real_rename(src, dst)

    monkeypatch.setattr(os, "rename", failing_rename)
    with pytest.raises(OSError):
        archives_mod.place_all(list(zip(ready, dests)))
    monkeypatch.undo()
    assert sorted(p.name for p in dests[0].iterdir()) == ["old"] and not dests[1].exists()
    assert all((r / "new").is_file() for r in ready) and sorted(p.name for p in dests[0].parent.iterdir()) == ["one"]


# ----------------------------------------------------------------------------- 4, 5. read-only data, download_dir
def test_data_in_place_needs_no_writable_folder(tmp_path, server, fixtures):
    """Everything in place: nothing is written, so a data folder where downloads/ cannot be created
    (a file of that name stands in for a read-only disk) still answers 'already there'."""
    base, state = server
    done = tmp_path / "data" / "lra_release" / "tsv_data"
    done.mkdir(parents=True)
    for name in layout.AAN.files:
        (done / name).write_text("1\ta\tb\tx\ty\n")
    (tmp_path / "data" / "downloads").write_text("not a folder")
    lines: list[str] = []
    opts = _opts(tmp_path, base, fixtures["archives"], lines)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    fetch(_units(tmp_path, "retrieval"), opts)
    assert state.requests == [] and "already there" in lines[-1]
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_unwritable_download_dir_names_its_setting(tmp_path, fixtures):
    (tmp_path / "a_file").write_text("")
    opts = FetchOptions(data_dir=tmp_path / "data", download_dir=tmp_path / "a_file" / "dl")
    with pytest.raises(NotWritableError, match=r"^fetch.download_dir=.*a_file/dl cannot be created") as e:
        fetch(_units(tmp_path, "text"), opts)
    assert "LRA_DATA_DIR" not in str(e.value) and "data dir" not in str(e.value)
    assert fetch_mod.options_from({"retries": 1, "retry_wait_s": 0, "timeout_s": 1}, tmp_path).download_dir is None


# ----------------------------------------------------------------------------- 6. 0-byte failures
def test_a_failure_with_nothing_received_claims_no_part_file(tmp_path, fixtures):
    opts = _opts(tmp_path, _closed_port(), fixtures["archives"])
    opts.transfer.retries = 0
    with pytest.raises(DataMissingError) as e:
        fetch(_units(tmp_path, "text"), opts)
    assert "Nothing was received, so no partial file is kept" in str(e.value) and ".part" not in str(e.value)
    assert not list((tmp_path / "data" / "downloads").glob("aclImdb*"))


# ----------------------------------------------------------------------------- 7. all tasks of an archive or none
@pytest.mark.parametrize("order", [("listops", "retrieval"), ("retrieval", "listops")])
def test_a_later_task_failing_puts_no_task_in_place(tmp_path, server, fixtures, order):
    """The release lacks one AAN file: neither listops nor retrieval is put in place, in either order."""
    base, state = server
    blob = tar_gz([(n, d) for n, d in _members(fixtures["archives"]["lra_release"]) if not n.endswith("aan_pairs.test.tsv")])
    state.files[url_path("lra_release")] = blob
    with pytest.raises(BadInputError, match="has no tsv_data/new_aan_pairs.test.tsv .*nothing was put in place"):
        fetch(_units(tmp_path, *order), _opts(tmp_path, base, {**fixtures["archives"], "lra_release": blob}))
    release = tmp_path / "data" / "lra_release"
    assert not (release / "listops-1000").exists() and not (release / "tsv_data").exists() and not _leftovers(tmp_path)


# ----------------------------------------------------------------------------- 8. Ctrl-C line of run.py
def test_ctrl_c_line_says_interrupted(monkeypatch, capsys):
    """A bare KeyboardInterrupt (Ctrl-C) prints 'run.py: interrupted', on the fetch and the training path."""
    import gc

    import run

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(fetch_mod, "run_overrides", ctrl_c)
    monkeypatch.setattr(run, "main", ctrl_c)
    monkeypatch.setattr(run, "check_overrides", lambda argv, conf_dir: None)
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # the handler ignores further presses
    monkeypatch.setattr(gc, "freeze", lambda: None)
    for argv in (["mode=fetch", "task=text"], ["task=listops"]):
        with pytest.raises(SystemExit) as e:
            run.cli(argv)
        assert e.value.code == 130
        assert capsys.readouterr().err == "run.py: interrupted\n", argv


# ----------------------------------------------------------------------------- 9. links and absolute names
def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mtime = kind, target, 0
    return info


@pytest.mark.parametrize("odd, named", [
    ([_link("aclImdb/train/neg", "/tmp"), ("aclImdb/train/neg/x.txt", b"through the link")],
     "a symbolic link 'aclImdb/train/neg' -> '/tmp'"),
    ([_link("aclImdb/test/pos/h.txt", "aclImdb/test/pos/0_1.txt", tarfile.LNKTYPE)], "a hard link 'aclImdb/test/pos/h.txt'"),
    ([("/tmp/absolute.txt", b"x")], "a member named '/tmp/absolute.txt', which points outside"),
    ([_link("aclImdb/fifo", "", tarfile.FIFOTYPE)], "a device or FIFO member 'aclImdb/fifo'"),
])
def test_links_and_absolute_names_are_refused_wherever_they_are(tmp_path, server, fixtures, odd, named):
    """One rule: an absolute name, '..', a link or a device anywhere in the archive (taken by a task or
    not) stops the extraction with an error naming it; nothing is put in place."""
    base, state = server
    blob = tar_gz([*_members(fixtures["archives"]["imdb"])[:3], *odd, *_members(fixtures["archives"]["imdb"])[3:]])
    state.files[url_path("imdb")] = blob
    with pytest.raises(BadInputError, match=f"aclImdb_v1.tar.gz has {named}.*nothing was put in place"):
        fetch(_units(tmp_path, "text"), _opts(tmp_path, base, {**fixtures["archives"], "imdb": blob}))
    assert not (tmp_path / "data" / "aclImdb").exists() and not _leftovers(tmp_path)


# ----------------------------------------------------------------------------- 10. a second fetch waits, and says so
def test_a_second_fetch_says_who_holds_the_lock_and_waits(tmp_path, server, fixtures):
    """Another process holds the archive's lock (a flock on another descriptor, its note beside it):
    the fetch names the holder and says it waits; it goes on once the lock is released."""
    base, _ = server
    lock = tmp_path / "data" / "downloads" / ".aclImdb_v1.tar.gz.lock"
    lock.parent.mkdir(parents=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    fetch_mod.write_holder_note(lock)
    lines: list[str] = []

    def log(line: str) -> None:
        lines.append(line)
        if "waiting" in line:
            fcntl.flock(fd, fcntl.LOCK_UN)  # the other fetch finishes

    opts = _opts(tmp_path, base, fixtures["archives"])
    opts.transfer.log = log
    watchdog = threading.Timer(20, fcntl.flock, (fd, fcntl.LOCK_UN))  # a fetch that never says it waits fails, not hangs
    watchdog.start()
    try:
        fetch(_units(tmp_path, "text"), opts)
    finally:
        watchdog.cancel()
        os.close(fd)
    waiting = [line for line in lines if "waiting" in line]
    assert waiting == [f"[fetch] aclImdb_v1.tar.gz: another fetch holds {lock} (pid {os.getpid()} on "
                       f"{socket.gethostname()}, since {waiting[0].split('since ')[1].split(': ')[0]}: python "
                       f"{' '.join(os.sys.argv)}): waiting for it to finish (Ctrl-C stops this fetch only)"]
    assert (tmp_path / "data" / "aclImdb" / "test" / "pos").is_dir()
    assert not (lock.parent / ".aclImdb_v1.tar.gz.lock.holder").exists()


# ----------------------------------------------------------------------------- the planted bugs' rules
def test_the_part_is_verified_before_it_is_renamed(tmp_path, server, fixtures, monkeypatch):
    """Ctrl-C while the whole download is being verified: the archive is not at its name yet (only
    a verified archive ever is), and the .part is kept for the next run."""
    base, _ = server
    real_check = download_mod.check
    dest = tmp_path / "data" / "downloads" / "aclImdb_v1.tar.gz"

    def ctrl_c_in_verification(url, expected, size, sha256, *args, **kwargs):
        if sha256 is not None:
            raise KeyboardInterrupt
        return real_check(url, expected, size, sha256, *args, **kwargs)

    monkeypatch.setattr(download_mod, "check", ctrl_c_in_verification)
    with pytest.raises(KeyboardInterrupt):
        fetch(_units(tmp_path, "text"), _opts(tmp_path, base, fixtures["archives"]))
    assert not dest.exists() and dest.with_name(dest.name + ".part").read_bytes() == fixtures["archives"]["imdb"]


def test_reconnects_are_counted_in_a_row(tmp_path, server, fixtures):
    """Cut after a quarter on every connection, 2 retries: 3 cuts in all, each after progress, so the
    download and the streamed release complete."""
    base, state = server
    for key, task in (("imdb", "text"), ("lra_release", "retrieval")):
        state.per_response[url_path(key)] = len(fixtures["archives"][key]) // 4 + 1
        state.requests.clear()
        opts = _opts(tmp_path, base, fixtures["archives"])
        opts.transfer.min_progress = 1
        fetch(_units(tmp_path, task), opts)
        assert len(state.requests) == 4, key
    assert (tmp_path / "data" / "lra_release" / "tsv_data" / "new_aan_pairs.test.tsv").is_file()


def test_an_empty_folder_is_not_a_complete_one(tmp_path, server, fixtures):
    base, state = server
    (tmp_path / "data" / "aclImdb").mkdir(parents=True)
    (tmp_path / "data" / "lra_release" / "pathfinder32" / "curv_baseline").mkdir(parents=True)
    for units in (_units(tmp_path, "text"), _units(tmp_path, "retrieval", members=["pathfinder32/curv_baseline"])):
        with pytest.raises(BadInputError, match="exists but is incomplete"):
            fetch(units, _opts(tmp_path, base, fixtures["archives"]))
    assert state.requests == []


def _same_size_twins(blob: bytes) -> tuple[bytes, bytes]:
    """Two valid .tar.gz of the same size: ``blob``'s files, and the same with one byte changed."""
    entries = _members(blob)
    name, data = entries[-1]
    other = [*entries[:-1], (name, bytes([data[0] ^ 1]) + data[1:])]
    return tar_gz(entries, level=0), tar_gz(other, level=0)


def test_a_local_archive_of_the_right_size_is_checked_by_its_sha256(tmp_path, fixtures):
    """fetch.from, and an archive already in download_dir: another file of the same size is refused
    naming the sha256, left where it is, and nothing is put in place."""
    good, wrong = _same_size_twins(fixtures["archives"]["imdb"])
    assert len(good) == len(wrong) and good != wrong
    closed = _closed_port()
    given = tmp_path / "elsewhere" / "aclImdb_v1.tar.gz"
    given.parent.mkdir()
    given.write_bytes(wrong)
    kept = tmp_path / "data" / "downloads" / "aclImdb_v1.tar.gz"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(wrong)
    for opts in (_opts(tmp_path, closed, {"imdb": good}, from_files=(given,)), _opts(tmp_path, closed, {"imdb": good})):
        with pytest.raises(BadInputError, match=f"failed verification: sha256 {hashlib.sha256(wrong).hexdigest()} "
                                                f"where {hashlib.sha256(good).hexdigest()} is expected"):
            fetch(_units(tmp_path, "text"), opts)
    assert given.read_bytes() == wrong and kept.read_bytes() == wrong
    assert not (tmp_path / "data" / "aclImdb").exists() and not _leftovers(tmp_path)


@pytest.mark.parametrize("field", ["crc32", "length"])
def test_the_release_gzip_stream_is_read_to_its_end(tmp_path, server, fixtures, field):
    """The release has no published checksum: a wrong CRC-32 or length in the gzip trailer (the tar
    inside intact) is found only by reading the stream to its end, and refused."""
    base, state = server
    blob = bytearray(fixtures["archives"]["lra_release"])
    blob[-8 if field == "crc32" else -4] ^= 0xFF
    state.files[url_path("lra_release")] = bytes(blob)
    no_release_sum = {k: v for k, v in fixtures["archives"].items() if k != "lra_release"}
    with pytest.raises(BadInputError, match=r"lra_release.gz .* is not an intact .tar.gz \(BadGzipFile: (CRC|Incorrect length)"):
        fetch(_units(tmp_path, "retrieval"), _opts(tmp_path, base, no_release_sum))
    assert not (tmp_path / "data" / "lra_release" / "tsv_data").exists() and not _leftovers(tmp_path)


def test_a_single_from_file_is_used_for_its_own_archive_only(tmp_path, server, fixtures):
    """task=text,image with fetch.from=aclImdb_v1.tar.gz: IMDb from the file, CIFAR-10 downloaded."""
    base, state = server
    given = tmp_path / "elsewhere" / "aclImdb_v1.tar.gz"
    given.parent.mkdir()
    given.write_bytes(fixtures["archives"]["imdb"])
    fetch(_units(tmp_path, "text", "image"), _opts(tmp_path, base, fixtures["archives"], from_files=(given,)))
    assert [p for p, _ in state.requests] == [url_path("cifar10")]
    assert (tmp_path / "data" / "aclImdb" / "test" / "pos").is_dir()
    assert (tmp_path / "data" / "cifar-10-batches-py" / "test_batch").is_file()
