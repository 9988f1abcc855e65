"""What a code bundle may hold (``check_bundle``): the rule the submission service checks
at upload and the runner before it unpacks. A bundle ``trainyard.bundle.pack`` made passes;
each hostile archive is refused naming its reason, without anything written."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import pytest

from trainyard.bundle import pack
from trainyard_platform.shared.bundle_archive import BundleRefused, check_bundle


def archive(*members: tuple[str, bytes | str | int], compress: bool = True) -> bytes:
    """A tar.gz of ``(name, content)``: bytes a file, a ``->target`` str a symbolic link,
    ``=target`` a hard link, an int a tarfile type (a device, a FIFO), ``/`` a folder."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz" if compress else "w") as tar:
        for name, content in members:
            info = tarfile.TarInfo(name)
            if isinstance(content, bytes):
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
                continue
            if content == "/":
                info.type = tarfile.DIRTYPE
            elif isinstance(content, str) and content.startswith("->"):
                info.type, info.linkname = tarfile.SYMTYPE, content[2:]
            elif isinstance(content, str) and content.startswith("="):
                info.type, info.linkname = tarfile.LNKTYPE, content[1:]
            else:
                assert isinstance(content, int)
                info.type = bytes([content])
            tar.addfile(info)
    return raw.getvalue()


def refused(data: bytes, **limits: int) -> str:
    with pytest.raises(BundleRefused) as raised:
        check_bundle(io.BytesIO(data), **limits)
    return str(raised.value)


def test_a_packed_bundle_passes(tmp_path: Path) -> None:
    code, out = tmp_path / "code", tmp_path / "out"
    (code / "pkg").mkdir(parents=True)
    out.mkdir()
    (code / "pkg" / "m.py").write_text("x = 1\n")
    (code / "train.py").write_text("print(1)\n")
    (code / "lib").symlink_to("pkg")
    (code / "pkg" / "up.py").symlink_to("../train.py")
    bundle = pack(code, out_dir=out)
    with bundle.path.open("rb") as raw:
        check_bundle(raw)
    check_bundle(io.BytesIO(archive(("a/", "/"), ("a/b", "->../c"), ("c", b"x"), ("./d", b""))))
    check_bundle(io.BytesIO(archive(("t", b"x"), ("h", "=t"))))  # tar's second name of a file
    # As tar -C code . writes it: the folder itself first, as "./".
    check_bundle(io.BytesIO(archive(("./", "/"), ("./train.py", b"x"), (".", "/"))))


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"not an archive at all", "not a gzip-compressed tar archive"),
        (gzip.compress(b"plain text, no tar"), "not a gzip-compressed tar archive"),
        (archive(("a", b"x" * 5000))[:60], "not a gzip-compressed tar archive"),
        (archive(("a", b"x"), compress=False), "not a gzip-compressed tar archive"),
        (archive(("/etc/cron.d/x", b"x")), "'/etc/cron.d/x' is an absolute path"),
        (archive(("a/../../x", b"x")), "'a/../../x' has a '..' part"),
        (archive(("..", "/")), "'..' has a '..' part"),
        (archive((".", b"x")), "an entry has no name ('.')"),
        (archive(("a", b"x"), ("./a", b"y")), "'./a' is in it twice"),
        (archive(("l", "->/etc/passwd")), "only a relative target inside the bundle"),
        (archive(("d/l", "->../../x")), "points to '../../x', outside the bundle"),
        # A chain: c/b is the bundle's root, so a -> c/b/.. leaves it (lexically it would not).
        (archive(("c/", "/"), ("c/b", "->.."), ("a", "->c/b/..")), "'a' points to 'c/b/..'"),
        (archive(("x", "->y"), ("y", "->x")), "'x' loops"),
        (archive(("l", "->."), ("l/f", b"x")), "'l/f' is inside symbolic link 'l'"),
        (archive(("h", "=t"), ("t", b"x")), "hard link 'h' points to 't', which is not a file"),
        (archive(("h", "=/etc/passwd")), "'/etc/passwd' is an absolute path"),
        (archive(("d/", "/"), ("h", "=d")), "hard link 'h' points to 'd'"),
        (archive(("tty", ord(tarfile.CHRTYPE))), "'tty' is a device"),
        (archive(("sda", ord(tarfile.BLKTYPE))), "'sda' is a device"),
        (archive(("p", ord(tarfile.FIFOTYPE))), "'p' is a FIFO"),
        # Names no file system holds (a runner failed them as the platform's error).
        (archive(("x" * 256, b"")), "has a folder or file name of 256 bytes"),
        (archive(("d/" + "é" * 128 + "/f", b"")), "has a folder or file name of 256 bytes"),
        (archive(("/".join(["d" * 200] * 21), b"")), "a path holds at most 4095 bytes"),
        (archive(("a/" * 300 + "f", b"")), "is 301 levels deep: at most 256"),
        (archive(("data", b"x"), ("data/f", b"")), "'data/f' is inside file 'data'"),
        (archive(("t", b"x"), ("h", "=t"), ("h/f", b"")), "'h/f' is inside file 'h'"),
    ],
    # Each case is named by its reason: a gzip header holds the time it was written, so
    # the archive's bytes as an id would differ between parallel workers (pytest-xdist).
    ids=lambda value: value if isinstance(value, str) else "archive",
)
def test_a_hostile_bundle_is_refused_naming_why(data: bytes, reason: str) -> None:
    assert reason in refused(data)


def test_a_bomb_is_refused_before_it_is_read_whole() -> None:
    bomb = archive(("zeros", b"\0" * 20_000_000))
    assert len(bomb) < 100_000  # zeros compress well
    assert "unpacks to more than 1000000 bytes" in refused(bomb, max_unpacked=1_000_000)
    many = archive(*((f"f{i}", b"") for i in range(11)))
    assert "more than 10 entries" in refused(many, max_members=10)


def test_names_at_the_file_systems_limits_pass() -> None:
    check_bundle(io.BytesIO(archive(("x" * 255, b""), ("é" * 127 + "x", b""))))
    check_bundle(io.BytesIO(archive(("a/" * 255 + "f", b""))))
    check_bundle(io.BytesIO(archive(("/".join(["d" * 199] * 20) + "/" + "f" * 95, b""))))


def test_a_long_name_is_shortened_in_the_reason() -> None:
    reason = refused(archive(("x" * 5000, b"")))
    assert "(5000 bytes)" in reason and len(reason) < 300
