#!/usr/bin/env python3
"""The shipped database's tracked form: db/shipped/attntune-shipped.db.tar.xz, one member.

The database repeats each campaign's search-space YAML (twelve distinct spaces in 1,100 rows: 24 of
its 38 MB in December 2026), which xz folds to ~1.7 MB; the repository keeps the archive, and the
build unpacks it into db/shipped/attntune-shipped.db (CMakeLists.txt: `cmake -E tar xf`, no xz
needed), where attntune, the tests and tools/build_shipped_db.sh read it (docs/design/shipped_db.md,
"The file in the repository"). The archive is deterministic: the same database packs to the same
bytes (no times, owners or modes of this machine), so an unchanged file commits no change.

  tools/shipped_archive.py pack DB ARCHIVE      DB -> ARCHIVE (written beside, then renamed)
  tools/shipped_archive.py unpack ARCHIVE DB    ARCHIVE's member -> DB (written beside, then renamed)
  tools/shipped_archive.py check ARCHIVE DB     exit 0 when DB holds ARCHIVE's member byte for byte,
                                                1 when it differs or is missing (a build or an unpack
                                                to redo), 2 for an archive that is not one
"""
import hashlib
import io
import os
import sys
import tarfile

MEMBER = "attntune-shipped.db"
PRESET = 6  # an 8 MiB window: the repeated spaces are ~40 KB apart


def die(msg, code=2):
    print(f"shipped_archive.py: error: {msg}", file=sys.stderr)
    sys.exit(code)


def member(archive):
    """The archive's one member (a regular file named MEMBER) and the open archive."""
    try:
        tar = tarfile.open(archive, "r:xz")
    except (OSError, tarfile.TarError) as e:
        die(f"'{archive}' is not a shipped-database archive: {e}")
    members = tar.getmembers()
    if len(members) != 1 or members[0].name != MEMBER or not members[0].isreg():
        die(f"'{archive}' should hold one file, {MEMBER}; it holds {[m.name for m in members]}")
    return tar, members[0]


def pack(db, archive):
    if not os.path.isfile(db):
        die(f"no database at '{db}'")
    info = tarfile.TarInfo(MEMBER)
    info.size = os.path.getsize(db)
    info.mode = 0o644
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tmp = f"{archive}.tmp.{os.getpid()}"
    try:
        with tarfile.open(tmp, "w:xz", preset=PRESET, format=tarfile.GNU_FORMAT) as tar, open(db, "rb") as f:
            tar.addfile(info, f)
        os.replace(tmp, archive)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    print(f"packed {db} ({info.size / 1e6:.1f} MB) into {archive} ({os.path.getsize(archive) / 1e6:.1f} MB)",
          file=sys.stderr)


def unpack(archive, db):
    tar, m = member(archive)
    tmp = f"{db}.tmp.{os.getpid()}"
    try:
        with tar, tar.extractfile(m) as src, open(tmp, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        os.replace(tmp, db)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    print(f"unpacked {archive} into {db} ({m.size / 1e6:.1f} MB)", file=sys.stderr)


def digest(f):
    h = hashlib.sha256()
    while chunk := f.read(1 << 20):
        h.update(chunk)
    return h.hexdigest()


def check(archive, db):
    tar, m = member(archive)
    with tar, tar.extractfile(m) as src:
        want = digest(src)
    if not os.path.isfile(db):
        print(f"'{db}' is missing: build attntune (cmake --build), or tools/shipped_archive.py unpack {archive} {db}",
              file=sys.stderr)
        return 1
    with open(db, "rb") as f:
        got = digest(f)
    if got != want:
        print(f"'{db}' is not what '{archive}' holds: build attntune again (it unpacks the archive when the archive "
              f"is newer), or pack it if it is the newer one (tools/build_shipped_db.sh does)", file=sys.stderr)
        return 1
    return 0


def main(argv):
    if len(argv) != 4 or argv[1] not in ("pack", "unpack", "check"):
        print(__doc__, file=sys.stderr)
        return 2
    cmd, a, b = argv[1:]
    if cmd == "pack":
        pack(a, b)
        return 0
    if cmd == "unpack":
        unpack(a, b)
        return 0
    return check(a, b)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
