"""mode=fetch (lra/data/fetch.py, download.py, archives.py) against a real HTTP server on 127.0.0.1
(tests/data/fetch_server.py) serving small archives in the official layouts: whole fetches followed by
training, a cut connection, a Ctrl-C (stopped by the code itself at a chosen byte), wrong checksums,
a 404, archives already on disk, member selection from the streamed release. Nothing leaves 127.0.0.1."""
from __future__ import annotations

import gc
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lra.badinput import BadInputError, ConfigError, DataMissingError, NotWritableError
from lra.data import archives as archives_mod
from lra.data import download as download_mod
from lra.data import fetch as fetch_mod
from lra.data import layout
from lra.data.download import INTERRUPT_ENV, ByteProgress, Transfer, mirrored
from lra.data.fetch import SOURCES, FetchOptions, expected_for, fetch, task_units, tfds_checksum_files
from tests.conftest import run_cli
from tests.data.fetch_server import (checksums_tsv, cifar_archive, imdb_archive, listops_tsv, release_archive, serve,
                                     tar_gz, url_path)


@pytest.fixture(scope="module")
def fixtures():
    cifar, images, labels = cifar_archive(per_batch=8)
    return {"archives": {"imdb": imdb_archive(n=10), "cifar10": cifar, "lra_release": release_archive()},
            "images": images, "labels": labels}


@pytest.fixture
def server(fixtures):
    with serve({url_path(k): b for k, b in fixtures["archives"].items()}) as (base, state):
        yield base, state


def _opts(tmp_path: Path, base: str, archives: dict[str, bytes], lines: list[str] | None = None, **kw) -> FetchOptions:
    sums = tmp_path / "checksums.tsv"
    sums.write_text(checksums_tsv(archives))
    log = lines.append if lines is not None else (lambda s: None)
    return FetchOptions(data_dir=tmp_path / "data", checksums=sums, mirror=base,
                        transfer=Transfer(retries=2, retry_wait_s=0.0, timeout_s=10.0, log=log), **kw)


def _units(tmp_path: Path, *tasks: str, **kw) -> list:
    return [u for t in tasks for u in task_units(t, tmp_path / "data", {}, 128 if t == "pathx" else 32, "hard", **kw)]


def _leftovers(folder: Path) -> list[str]:
    """Staging folders and partial files anywhere under ``folder``."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if ".fetching-" in p.name or ".replaced-" in p.name)


# ----------------------------------------------------------------------------- sources and checksums
def test_registry_checksums_come_from_tensorflow_datasets():
    """IMDb's and CIFAR-10's size and sha256 are the installed tensorflow-datasets registry's (read with
    tfds's own parser here), and no digest is written in the fetch code."""
    from tensorflow_datasets.core.download import checksums as tfds_checksums

    for key, dataset in (("imdb", "imdb_reviews"), ("cifar10", "cifar10")):
        files = tfds_checksum_files(dataset)
        infos = {}
        for f in files:
            infos.update(tfds_checksums.load_url_infos(f))
        info = infos[SOURCES[key].url]
        got = expected_for(SOURCES[key], None, None)
        assert (got.size, got.sha256) == (info.size, info.checksum), key
        assert got.origin.startswith("tensorflow-datasets registry") and str(files[0]) in got.origin
    code = "".join(Path(m.__file__).read_text() for m in (fetch_mod, download_mod, archives_mod))
    assert not re.search(r"[0-9a-fA-F]{64}", code)
    release = expected_for(SOURCES["lra_release"], None, None)
    assert release.size is None and release.sha256 is None and "server" in release.origin
    assert expected_for(SOURCES["lra_release"], None, "AB" * 32).sha256 == "ab" * 32


def test_extra_checksum_file_is_read_first(tmp_path):
    sums = tmp_path / "sums.tsv"
    sums.write_text(f"{SOURCES['imdb'].url}\t12\t{'c' * 64}\taclImdb_v1.tar.gz\n")
    got = expected_for(SOURCES["imdb"], sums, None)
    assert (got.size, got.sha256) == (12, "c" * 64) and str(sums) in got.origin


def test_the_fetch_puts_each_task_where_its_reader_looks(tmp_path):
    """Both read lra.data.layout: at its default place and at a folder its setting names, each task's
    reader names the fetch's folder when it is missing, and accepts it once it holds what the fetch puts there."""
    from lra.data.image import ImageDataModule
    from lra.data.listops import ListOpsDataModule
    from lra.data.pathfinder import PathfinderDataModule
    from lra.data.retrieval import RetrievalDataModule
    from lra.data.text import TextDataModule

    data = str(tmp_path / "data")
    readers = {  # task -> (its folder setting, its reader's check)
        "text": ("imdb_dir", lambda dm: TextDataModule(data, 16, source="folder", **dm)),
        "image": ("cifar_dir", lambda dm: ImageDataModule(data, source="folder", **dm)),
        "retrieval": ("aan_dir", lambda dm: RetrievalDataModule(data, 16, **dm).check_sources()),
        "listops": ("official_dir", lambda dm: ListOpsDataModule(data, 16, source="official", **dm).check_sources()),
        "pathfinder": ("official_dir", lambda dm: PathfinderDataModule(data, 64 * 64, resolution=64, difficulty="easy",
                                                                       source="official", **dm)),
    }
    for task, (setting, read) in readers.items():
        for dm in ({}, {setting: str(tmp_path / f"own_{task}")}):
            [unit] = task_units(task, Path(data), dm, 64, "easy")
            with pytest.raises(DataMissingError) as e:
                read(dm)
            assert str(unit.dest) in str(e.value) and "mode=fetch" in str(e.value), (task, dm)
            for name in unit.required:  # files have a suffix, the rest are folders
                (unit.dest / name).parent.mkdir(parents=True, exist_ok=True)
                if Path(name).suffix:
                    (unit.dest / name).touch()
                else:
                    (unit.dest / name).mkdir()
            read(dm)


def test_the_layout_and_the_fetch_import_no_torch():
    """The layout is standard library only (the readers and the fetch share it), and the fetch does
    not pull torch in with it."""
    code = ("import sys, lra.data.layout; assert not {'torch', 'numpy'} & set(sys.modules); "
            "import lra.data.fetch; assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], cwd=Path(fetch_mod.__file__).parents[2], check=True)


@pytest.mark.slow
def test_both_fetch_command_lines_take_their_defaults_from_the_config(tmp_path, monkeypatch):
    """python -m lra.data.fetch and run.py mode=fetch plan the same fetch from conf/ (paths.data_dir,
    the fetch: block, each task's resolution and difficulty); the flags replace single settings."""
    planned: list = []
    monkeypatch.setattr(fetch_mod, "fetch", lambda units, opts: planned.append((units, opts)))
    monkeypatch.setenv("LRA_DATA_DIR", str(tmp_path / "d"))
    assert fetch_mod.main(["pathx", "text"]) == 0
    fetch_mod.run_overrides(["mode=fetch", "task=pathx,text"], fetch_mod.CONF_DIR)
    assert planned[0] == planned[1]
    units, opts = planned[0]
    cfg = fetch_mod._compose(fetch_mod.CONF_DIR, ["task=pathx"])
    assert (opts.transfer.retries, opts.transfer.retry_wait_s, opts.transfer.timeout_s) == (
        cfg.fetch.retries, cfg.fetch.retry_wait_s, cfg.fetch.timeout_s)
    release = tmp_path / "d" / layout.RELEASE
    assert opts.data_dir == tmp_path / "d" and [u.dest for u in units] == [
        release / f"pathfinder{cfg.task.resolution}" / fetch_mod.PATHFINDER_FOLDERS[cfg.task.difficulty],
        tmp_path / "d" / layout.IMDB.leaf()]
    assert fetch_mod.main(["pathfinder", "--resolution", "64", "--difficulty", "easy", "--retries", "0",
                           "--data-dir", str(tmp_path / "e")]) == 0
    units, opts = planned[-1]
    assert opts.transfer.retries == 0 and [u.dest for u in units] == [
        tmp_path / "e" / layout.RELEASE / "pathfinder64" / "curv_baseline"]


def test_mirror_replaces_scheme_and_host():
    url = SOURCES["imdb"].url
    assert mirrored(url, "http://127.0.0.1:8000") == "http://127.0.0.1:8000/~amaas/data/sentiment/aclImdb_v1.tar.gz"
    assert mirrored(url, "https://m.example/lra/") == "https://m.example/lra/~amaas/data/sentiment/aclImdb_v1.tar.gz"
    assert mirrored(url, "") == url
    with pytest.raises(DataMissingError, match="LRA_MIRROR"):
        mirrored(url, "127.0.0.1:8000")


def test_progress_lines_at_most_every_10_s():
    now, lines = [0.0], []
    p = ByteProgress("[fetch] x", 1_000_000_000, every_s=10.0, log=lines.append, clock=lambda: now[0])
    for t, done in ((5, 100_000_000), (9.9, 200_000_000), (10, 250_000_000), (15, 300_000_000), (21, 500_000_000)):
        now[0] = t
        p.update(done)
    assert lines == ["[fetch] x: 250 MB of 1.00 GB (25%), 25.0 MB/s, eta 30s",
                     "[fetch] x: 500 MB of 1.00 GB (50%), 23.8 MB/s, eta 21s"]
    p.finish()
    assert lines[-1] == "[fetch] x: 500 MB in 21s, 23.8 MB/s"


# ----------------------------------------------------------------------------- whole fetches
@pytest.mark.slow
def test_fetch_then_train_text_image_retrieval(tmp_path, server, fixtures, cli):
    """run.py mode=fetch task=text,image,retrieval against the loopback mirror, then one multirun
    trains the quick preset's tiny model two steps on each fetched dataset."""
    base, state = server
    sums = tmp_path / "checksums.tsv"
    sums.write_text(checksums_tsv(fixtures["archives"]))
    env = {"LRA_MIRROR": base, "LRA_CHECKSUMS": str(sums)}
    proc = cli("mode=fetch", "task=text,image,retrieval", env=env)
    final = proc.stdout.strip().splitlines()[-1]
    assert final.startswith("[fetch] done") and "text -> " in final and "image -> " in final and "retrieval -> " in final
    assert sorted(p for p, _ in state.requests) == sorted(url_path(k) for k in ("imdb", "cifar10", "lra_release"))
    assert not (tmp_path / "outputs").exists()  # no Hydra run folder for a fetch
    cli("-m", "experiment=quick", "task=text,image,retrieval", "logger=none", "task.batch_size=8",
        "task.max_steps=2", "task.val_every=2", "task.warmup_steps=1", "trainer.enable_progress_bar=false",
        env={"TFDS_DATA_DIR": str(tmp_path / "no_tfds")})
    recs = {r["task"]: r for r in (json.loads(p.read_text()) for p in (tmp_path / "results" / "runs").glob("*.json"))}
    assert sorted(recs) == ["image", "retrieval", "text"]
    for rec in recs.values():
        assert rec["status"] == "finished" and 0.0 <= rec["metrics"]["test_acc"] <= 1.0, rec.get("error")


def test_prepared_data_is_the_archives_content(tmp_path, server, fixtures):
    """aclImdb as the text reader reads it; the CIFAR-10 binary records as the python pickles the image
    reader reads (same pixels, labels and order); provenance beside the data."""
    from lra.data.image import read_cifar_folder
    from lra.data.tfds_source import tfds_order
    from lra.data.text import read_imdb_folder
    from tests.data.test_data_text import make_imdb

    base, _ = server
    lines: list[str] = []
    fetch(_units(tmp_path, "text", "image"), _opts(tmp_path, base, fixtures["archives"], lines))
    data = tmp_path / "data"
    expected_texts, expected_labels = read_imdb_folder(make_imdb(tmp_path / "orig", n=10), "test")
    texts, labels = read_imdb_folder(data / "aclImdb", "test")
    assert texts == expected_texts and labels.tolist() == expected_labels.tolist()
    assert not (data / "aclImdb" / "train" / "unsup").exists()  # only what the reader reads
    images, labels = read_cifar_folder(data / "cifar-10-batches-py", "train")
    order = tfds_order(range(40), "train")
    assert np.array_equal(images, fixtures["images"][:40][order]) and np.array_equal(labels, fixtures["labels"][:40][order])
    test_images, _ = read_cifar_folder(data / "cifar-10-batches-py", "test")
    assert np.array_equal(test_images, fixtures["images"][40:][tfds_order(range(8), "test")])
    meta = json.loads((data / "aclImdb" / ".fetched.json").read_text())
    assert meta["sha256"] == hashlib.sha256(fixtures["archives"]["imdb"]).hexdigest() and meta["url"] == SOURCES["imdb"].url
    assert lines[-1].startswith("[fetch] done") and "archives kept in" in lines[-1]
    assert (data / "downloads" / "aclImdb_v1.tar.gz").read_bytes() == fixtures["archives"]["imdb"]


def test_release_members_streamed_and_selected(tmp_path, server, fixtures, caplog):
    """The release is unpacked as it streams (nothing stored): only the members asked for, the inner
    lra_release/lra_release/ copy of a doubled folder, and the Path-X warning for pathfinder128."""
    from lra.data.listops import ListOpsDataModule, read_tsv
    from lra.data.pathfinder import PathfinderDataModule

    base, _ = server
    lines: list[str] = []
    units = _units(tmp_path, "listops", "pathfinder", "pathx") + _units(tmp_path, "retrieval", members=["pathfinder32/curv_baseline"])
    fetch(units, _opts(tmp_path, base, fixtures["archives"], lines))
    release = tmp_path / "data" / "lra_release"
    assert sorted(p.relative_to(release).as_posix() for p in release.iterdir()) == ["listops-1000", "pathfinder128", "pathfinder32"]
    assert sorted(p.name for p in (release / "pathfinder32").iterdir()) == ["curv_baseline", "curv_contour_length_14"]
    assert not (tmp_path / "data" / "downloads" / "lra_release.gz").exists() and not _leftovers(tmp_path)
    assert (release / "listops-1000" / "basic_train.tsv").read_bytes() == listops_tsv(20, seed=0)  # the inner copy
    assert (release / "pathfinder128" / "curv_contour_length_14" / "imgs").is_dir()  # not the stray outer one
    assert any(l.startswith("[warning] the LRA release's pathfinder128") for l in lines)
    dm = ListOpsDataModule(str(tmp_path / "data"), max_len=64, source="official")
    dm.prepare_data()
    dm.setup()
    assert dm.datasets["train"].labels.tolist() == [t for _, t in read_tsv(release / "listops-1000" / "basic_train.tsv")]
    pf = PathfinderDataModule(str(tmp_path / "data"), source="official", generator={"workers": 1})
    pf.prepare_data()
    pf.setup()
    assert sum(len(pf.datasets[s]) for s in ("train", "val", "test")) == 12
    with caplog.at_level("WARNING"):
        PathfinderDataModule(str(tmp_path / "data"), max_len=16384, resolution=128, source="official")
    assert "google-research/long-range-arena#38" in caplog.text


# ----------------------------------------------------------------------------- failures
def test_cut_connection_is_resumed_with_a_range_request(tmp_path, server, fixtures):
    base, state = server
    blob = fixtures["archives"]["imdb"]
    half = len(blob) // 2
    state.cut_once[url_path("imdb")] = half
    lines: list[str] = []
    fetch(_units(tmp_path, "text"), _opts(tmp_path, base, fixtures["archives"], lines))
    assert state.requests == [(url_path("imdb"), None), (url_path("imdb"), f"bytes={half}-")]
    assert (tmp_path / "data" / "downloads" / "aclImdb_v1.tar.gz").read_bytes() == blob
    assert any("reconnecting (1/2)" in l for l in lines)
    state.requests.clear()
    state.cut_once[url_path("lra_release")] = 5000  # the streamed release resumes the same way
    fetch(_units(tmp_path, "retrieval"), _opts(tmp_path, base, fixtures["archives"]))
    assert state.requests == [(url_path("lra_release"), None), (url_path("lra_release"), "bytes=5000-")]
    assert (tmp_path / "data" / "lra_release" / "tsv_data" / "new_aan_pairs.test.tsv").is_file()


def test_interrupted_fetch_leaves_no_dataset_and_resumes(tmp_path, server, fixtures, monkeypatch):
    """Ctrl-C (raised by the downloader itself once byte 300 is on disk): no dataset, no staging
    folder, a .part of exactly 300 bytes; the next run asks for bytes=300- and gets the same archive."""
    base, state = server
    blob, data = fixtures["archives"]["imdb"], tmp_path / "data"
    monkeypatch.setenv(INTERRUPT_ENV, "300")
    lines: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        fetch(_units(tmp_path, "text"), _opts(tmp_path, base, fixtures["archives"], lines))
    part = data / "downloads" / "aclImdb_v1.tar.gz.part"
    assert part.read_bytes() == blob[:300] and not (data / "aclImdb").exists() and not _leftovers(tmp_path)
    assert "run the same command to resume" in lines[-1]
    monkeypatch.delenv(INTERRUPT_ENV)
    fetch(_units(tmp_path, "text"), _opts(tmp_path, base, fixtures["archives"]))
    assert state.requests[-1] == (url_path("imdb"), "bytes=300-")
    assert (data / "downloads" / "aclImdb_v1.tar.gz").read_bytes() == blob and not part.exists()
    assert (data / "aclImdb" / "test" / "pos").is_dir()


def test_interrupted_release_stream_leaves_nothing(tmp_path, server, fixtures, monkeypatch):
    """Streamed: an interrupt after every wanted member was unpacked (3 MB of an unwanted member follow
    them; reads are at most 1 MiB, so they were handed over) leaves none of them in place and no
    staging folder. With fetch.keep_archive the release goes through a resumable .part instead."""
    base, state = server
    big = release_archive(filler=3_000_000)
    state.files[url_path("lra_release")] = big
    served = {**fixtures["archives"], "lra_release": big}
    monkeypatch.setenv(INTERRUPT_ENV, str(len(big) - 100))
    with pytest.raises(KeyboardInterrupt):
        fetch(_units(tmp_path, "retrieval", "listops"), _opts(tmp_path, base, served))
    release = tmp_path / "data" / "lra_release"
    assert not (release / "tsv_data").exists() and not (release / "listops-1000").exists() and not _leftovers(tmp_path)
    monkeypatch.setenv(INTERRUPT_ENV, "4096")
    with pytest.raises(KeyboardInterrupt):
        fetch(_units(tmp_path, "retrieval"), _opts(tmp_path, base, served, keep_archive=True))
    assert (tmp_path / "data" / "downloads" / "lra_release.gz.part").stat().st_size == 4096
    monkeypatch.delenv(INTERRUPT_ENV)
    fetch(_units(tmp_path, "retrieval"), _opts(tmp_path, base, served, keep_archive=True))
    assert state.requests[-1] == (url_path("lra_release"), "bytes=4096-")
    assert (tmp_path / "data" / "downloads" / "lra_release.gz").read_bytes() == big


def test_wrong_checksum_exits_2_and_keeps_what_was_there(tmp_path, server, fixtures):
    """run.py: a wrong sha256 is one 'error:' paragraph, exit 2; the earlier aclImdb (fetch.force
    would replace it) is untouched and no download or staging folder is left."""
    base, _ = server
    sums = tmp_path / "checksums.tsv"
    sums.write_text(checksums_tsv({**fixtures["archives"], "imdb": b"other bytes"}).replace(
        f"\t{len(b'other bytes')}\t", f"\t{len(fixtures['archives']['imdb'])}\t"))
    old = tmp_path / "data" / "aclImdb"
    (old / "train").mkdir(parents=True)
    (old / "train" / "mine.txt").write_text("keep me")
    proc = run_cli(["mode=fetch", "task=text", "fetch.force=true"], tmp_path,
                   env={"LRA_MIRROR": base, "LRA_CHECKSUMS": str(sums)}, check=False)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    assert "sha256" in err and "nothing was put in place" in err and "fetch.from=FILE" in err
    assert (old / "train" / "mine.txt").read_text() == "keep me" and sorted(p.name for p in old.iterdir()) == ["train"]
    assert not list((tmp_path / "data" / "downloads").glob("aclImdb*")) and not _leftovers(tmp_path)


def test_not_found_names_the_url_and_the_way_out(tmp_path, server, fixtures):
    base, state = server
    with pytest.raises(DataMissingError, match=r"HTTP 404 .*/mirror/~amaas/data/sentiment/aclImdb_v1.tar.gz.*fetch.from=FILE"):
        fetch(_units(tmp_path, "text"), _opts(tmp_path, base + "/mirror", fixtures["archives"]))
    assert len(state.requests) == 1  # a 404 is not retried
    assert not (tmp_path / "data" / "aclImdb").exists() and not list((tmp_path / "data" / "downloads").glob("aclImdb*"))


def test_server_without_range_support_starts_again(tmp_path, server, fixtures):
    base, state = server
    blob = fixtures["archives"]["cifar10"]
    part = tmp_path / "data" / "downloads" / "cifar-10-binary.tar.gz.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(blob[:1000])
    state.ignore_range = True
    lines: list[str] = []
    fetch(_units(tmp_path, "image"), _opts(tmp_path, base, fixtures["archives"], lines))
    assert state.requests == [(url_path("cifar10"), "bytes=1000-")] and any("does not resume" in l for l in lines)
    assert (tmp_path / "data" / "downloads" / "cifar-10-binary.tar.gz").read_bytes() == blob


def test_from_file_uses_no_network(tmp_path, fixtures, monkeypatch, capsys):
    """python -m lra.data.fetch text --from FILE: verified and unpacked with the mirror pointing at a
    closed port (any request would fail)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    archive = tmp_path / "elsewhere" / "aclImdb_v1.tar.gz"
    archive.parent.mkdir()
    archive.write_bytes(fixtures["archives"]["imdb"])
    sums = tmp_path / "checksums.tsv"
    sums.write_text(checksums_tsv(fixtures["archives"]))
    monkeypatch.setenv("LRA_MIRROR", closed)
    monkeypatch.setenv(fetch_mod.CHECKSUMS_ENV, str(sums))
    assert fetch_mod.main(["text", "--data-dir", str(tmp_path / "data"), "--from", str(archive), "--retries", "0"]) == 0
    assert (tmp_path / "data" / "aclImdb" / "train" / "neg").is_dir() and archive.exists()
    assert "unpacking text from" in capsys.readouterr().out
    stray = tmp_path / "elsewhere" / "imdb.tgz"
    stray.write_bytes(b"x")  # with two archives needed, a file is matched by its name
    with pytest.raises(ConfigError, match=r"imdb.tgz: the name matches none .*aclImdb_v1.tar.gz, cifar-10-binary.tar.gz"):
        fetch(_units(tmp_path, "text", "image"), _opts(tmp_path, closed, fixtures["archives"], from_files=(stray,)))
    archive.write_bytes(fixtures["archives"]["imdb"][:-1])  # a truncated copy is refused and kept
    monkeypatch.setattr(gc, "freeze", lambda: None)  # exit_user_error's, which would freeze this test process
    with pytest.raises(SystemExit) as stopped:  # lra.badinput.exit_user_error
        fetch_mod.main(["text", "--data-dir", str(tmp_path / "d2"), "--from", str(archive)])
    assert stopped.value.code == 2
    assert "bytes where" in capsys.readouterr().err and archive.exists() and not (tmp_path / "d2" / "aclImdb").exists()


def test_member_outside_its_folder_is_refused(tmp_path, server, fixtures):
    base, state = server
    evil = tar_gz([("aclImdb/train/neg/0_1.txt", b"fine"), ("aclImdb/train/neg/../../../../evil.txt", b"gotcha")])
    state.files[url_path("imdb")] = evil
    with pytest.raises(BadInputError, match="points outside its folder"):
        fetch(_units(tmp_path, "text"), _opts(tmp_path, base, {**fixtures["archives"], "imdb": evil}))
    assert not list(tmp_path.rglob("evil.txt")) and not (tmp_path / "data" / "aclImdb").exists() and not _leftovers(tmp_path)


def test_data_in_place_is_kept_or_refused(tmp_path, server, fixtures):
    base, state = server
    done = tmp_path / "data" / "lra_release" / "tsv_data"
    done.mkdir(parents=True)
    for name in layout.AAN.files:
        (done / name).write_text("1\ta\tb\tx\ty\n")
    lines: list[str] = []
    fetch(_units(tmp_path, "retrieval"), _opts(tmp_path, base, fixtures["archives"], lines))
    assert state.requests == [] and "already there" in lines[-1]
    half = tmp_path / "data" / "aclImdb"
    (half / "train" / "neg").mkdir(parents=True)
    with pytest.raises(BadInputError, match=r"incomplete \(no train/pos, test/neg, test/pos\).*fetch.force=true"):
        fetch(_units(tmp_path, "text"), _opts(tmp_path, base, fixtures["archives"]))
    assert state.requests == [] and sorted(p.name for p in half.iterdir()) == ["train"]


def test_task_names_and_options_are_checked(tmp_path):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(NotWritableError, match="a_file/data/downloads cannot be created"):
        fetch(_units(tmp_path / "a_file", "text"), FetchOptions(data_dir=tmp_path / "a_file" / "data"))
    with pytest.raises(ConfigError, match="did you mean task=image"):
        fetch_mod._task_names("imag")
    assert fetch_mod._task_names("all") == ["listops", "text", "retrieval", "image", "pathfinder"]
    with pytest.raises(ConfigError, match="fetch.release_sha256"):
        fetch_mod.options_from({"retries": 1, "retry_wait_s": 0, "timeout_s": 1, "release_sha256": "abc"}, tmp_path)
    with pytest.raises(ConfigError, match="fetch.retries"):
        fetch_mod.options_from({"retries": -1, "retry_wait_s": 0, "timeout_s": 1}, tmp_path)


# ----------------------------------------------------------------------------- the readers point at fetch
def test_missing_data_errors_name_the_fetch_command_first(tmp_path):
    from lra.data.image import ImageDataModule
    from lra.data.listops import ListOpsDataModule
    from lra.data.pathfinder import PathfinderDataModule
    from lra.data.retrieval import RetrievalDataModule
    from lra.data.text import TextDataModule

    def message(make) -> str:
        with pytest.raises(DataMissingError) as e:
            make()
        return str(e.value)

    nothing = str(tmp_path / "no_tfds")
    cases = {
        "text": message(lambda: TextDataModule(str(tmp_path), 16, source="tfds", tfds_data_dir=nothing).prepare_data()),
        "text folder": message(lambda: TextDataModule(str(tmp_path), 16, source="folder")),
        "image": message(lambda: ImageDataModule(str(tmp_path), source="tfds", tfds_data_dir=nothing).prepare_data()),
        "retrieval": message(lambda: RetrievalDataModule(str(tmp_path), 16).prepare_data()),
        "listops": message(lambda: ListOpsDataModule(str(tmp_path), 16, source="official").prepare_data()),
        "pathfinder": message(lambda: PathfinderDataModule(str(tmp_path), source="official", difficulty="easy")),
    }
    commands = {"text": "task=text", "text folder": "task=text", "image": "task=image", "retrieval": "task=retrieval",
                "listops": "task=listops", "pathfinder": "task=pathfinder task.difficulty=easy"}
    for name, text in cases.items():
        fetch_at = text.find(f"python run.py mode=fetch {commands[name]}")
        others = [i for i in (text.find("tfds build"), text.find("Download"), text.find("download")) if i >= 0]
        assert 0 <= fetch_at < min(others), (name, text)
