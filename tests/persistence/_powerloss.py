"""Power-loss crash states rebuilt from a writer's recorded file syscalls.

A writer process runs under ``strace -f -y -xx`` (every string hex-escaped, every fd argument
followed by the path it names), so the writes of Python's ``os`` calls and of SQLite's C code
are recorded alike. :func:`parse_trace` turns the trace into a list of operations on a small
model file system, following descriptors, offsets, ``O_APPEND``, renames and links, and keeping
only what happens under the store's root (plus the writer's acknowledgement marks). Replaying
every operation must give exactly the files the writer left (:func:`FileSystem.matches`),
which checks the parser against the real disk.

:func:`crash_state` then picks, for a cut (the number of operations issued before the power
went) and a write-back model, which issued operations reached the disk, and replays those.
The models (docs/testing.md#power-loss):

- ``strict``: every operation before the cut;
- ``prefix``: per file, its data operations up to its last ``fsync`` and then a random prefix
  of the later ones; namespace operations (create, mkdir, link, rename, unlink) as one journal,
  up to the last one a folder ``fsync`` made durable and then a random prefix;
- ``page-subset``: as ``prefix`` for the namespace; a file's unsynced writes are cut into the
  4 KiB pages they touch and any subset of those pieces lands (a file grows to the end of the
  last piece that landed; pages between read as zeros); an unsynced truncate lands or not;
- ``ordered`` (a journal that writes data before the metadata that follows it): a random
  journal commit point no earlier than the last folder ``fsync``; everything issued before it
  landed; after it, namespace operations and size changes are lost (a create or rename without
  a folder ``fsync`` may vanish), except that a file's ``fsync`` makes its own data and size
  durable; unsynced overwrites inside the durable size land as any subset of pages.

SQLite's ``-shm`` file is shared memory (written through ``mmap``, which no trace shows) and is
never materialised: SQLite rebuilds it from the WAL, as after any crash.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

MODELS = ("strict", "prefix", "page-subset", "ordered")
PAGE_BYTES = 4096

TRACED = ("openat,open,creat,write,pwrite64,writev,pwritev,pwritev2,lseek,ftruncate,truncate,"
          "fsync,fdatasync,rename,renameat,renameat2,link,linkat,unlink,unlinkat,mkdir,mkdirat,"
          "rmdir,close,dup,dup2,dup3,fcntl")

O_CREAT = "O_CREAT"


@dataclass(frozen=True)
class Op:
    """One recorded operation. ``kind`` is one of:

    ``write`` (ino, off, data), ``trunc`` (ino, size), ``sync`` (ino: a file or a folder),
    ``create``/``mkdir``/``link`` (parent, name, ino), ``unlink`` (parent, name),
    ``rename`` (parent, name, parent2, name2), ``ack`` (size: the acknowledged event count).
    """

    kind: str
    ino: int = -1
    off: int = 0
    data: bytes = b""
    size: int = 0
    parent: int = -1
    name: str = ""
    parent2: int = -1
    name2: str = ""

    @property
    def is_namespace(self) -> bool:
        return self.kind in ("create", "mkdir", "link", "unlink", "rename")


@dataclass
class FileSystem:
    """Folders as ``{name: ino}``, files as their bytes; inode 0 is the store's root."""

    folders: dict[int, dict[str, int]] = field(default_factory=lambda: {0: {}})
    files: dict[int, bytearray] = field(default_factory=dict)

    def apply(self, op: Op) -> None:
        """Apply one operation (a piece of a write is a write)."""
        if op.kind == "write":
            data = self.files.setdefault(op.ino, bytearray())
            if len(data) < op.off:
                data.extend(bytes(op.off - len(data)))
            data[op.off:op.off + len(op.data)] = op.data
        elif op.kind == "trunc":
            data = self.files.setdefault(op.ino, bytearray())
            del data[op.size:]
            data.extend(bytes(op.size - len(data)))
        elif op.kind in ("create", "link"):
            self.files.setdefault(op.ino, bytearray())
            self.folders[op.parent][op.name] = op.ino
        elif op.kind == "mkdir":
            self.folders.setdefault(op.ino, {})
            self.folders[op.parent][op.name] = op.ino
        elif op.kind == "unlink":
            self.folders[op.parent].pop(op.name, None)
        elif op.kind == "rename":
            ino = self.folders[op.parent].pop(op.name, None)
            if ino is not None:
                self.folders[op.parent2][op.name2] = ino

    def walk(self, ino: int = 0, prefix: str = "") -> Iterable[tuple[str, int]]:
        """Every reachable ``(relative path, ino)``, folders before what they hold."""
        for name, child in sorted(self.folders[ino].items()):
            path = f"{prefix}{name}"
            yield path, child
            if child in self.folders:
                yield from self.walk(child, path + "/")

    def materialise(self, target: Path) -> None:
        """Write the reachable tree under ``target`` (folders 0700, files 0600), no ``-shm``."""
        target.mkdir(mode=0o700, parents=True)
        for path, ino in self.walk():
            if ino in self.folders:
                (target / path).mkdir(mode=0o700)
            elif not path.endswith("-shm"):
                fd = os.open(target / path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    os.write(fd, bytes(self.files[ino]))
                finally:
                    os.close(fd)

    def matches(self, root: Path) -> list[str]:
        """The differences between this tree and the real one at ``root`` (``-shm`` aside)."""
        mine = {p: (None if i in self.folders else bytes(self.files[i])) for p, i in self.walk()}
        real: dict[str, bytes | None] = {}
        for dirpath, dirnames, filenames in os.walk(root):
            rel = os.path.relpath(dirpath, root)
            for d in dirnames:
                real[os.path.normpath(os.path.join(rel, d))] = None
            for f in filenames:
                real[os.path.normpath(os.path.join(rel, f))] = Path(dirpath, f).read_bytes()
        keys = {k for k in mine.keys() | real.keys() if not k.endswith("-shm")}
        return sorted(k for k in keys if mine.get(k, b"?") != real.get(k, b"!"))


def record(argv: list[str], trace: Path, cwd: Path) -> None:
    """Run ``argv`` under strace, writing the trace to ``trace``; raise if the writer fails."""
    subprocess.run(["strace", "-f", "-qq", "-xx", "-s", str(1 << 24), "-y", "-o", str(trace),
                    "-e", f"trace={TRACED}", *argv], check=True, cwd=cwd, timeout=300)


_LINE = re.compile(r"^(\d+) +(\w+)\((.*)\) += (-?\d+|0x[0-9a-f]+)(?:<(.*?)>)?(?: .*)?$")
_HEX = re.compile(r"\\x([0-9a-f]{2})")


def _unescape(text: str) -> bytes:
    """Undo strace's ``-xx`` escaping of a string or an annotation."""
    out = bytearray()
    i = 0
    while i < len(text):
        if text.startswith("\\x", i):
            out.append(int(text[i + 2:i + 4], 16))
            i += 4
        elif text.startswith("\\", i):
            esc = text[i + 1]
            out.extend({"n": b"\n", "t": b"\t", "\\": b"\\", '"': b'"'}.get(esc, esc.encode()))
            i += 2
        else:
            out.extend(text[i].encode())
            i += 1
    return bytes(out)


def _split_args(args: str) -> list[str]:
    """Top-level arguments (strings are hex-escaped, so only brackets need counting)."""
    parts, depth, start, quoted = [], 0, 0, False
    for i, ch in enumerate(args):
        if ch == '"' and (i == 0 or args[i - 1] != "\\"):
            quoted = not quoted
        elif quoted:
            continue
        elif ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(args[start:i].strip())
            start = i + 1
    parts.append(args[start:].strip())
    return parts


def _fd(arg: str) -> tuple[str, str | None]:
    """``3</path>`` -> ("3", "/path"); ``AT_FDCWD</cwd>`` -> ("AT_FDCWD", "/cwd")."""
    m = re.match(r"^([\w-]+)(?:<(.*)>)?(?:\(deleted\))?$", arg)
    if m is None:
        raise ValueError(f"not a descriptor argument: {arg!r}")
    path = m.group(2)
    return m.group(1), None if path is None else os.fsdecode(_unescape(path))


def _string(arg: str) -> bytes:
    if arg.endswith("..."):
        raise ValueError("strace cut a string: raise -s")
    assert arg.startswith('"') and arg.endswith('"'), arg
    return _unescape(arg[1:-1])


@dataclass
class _Open:
    ino: int
    append: bool
    pos: int = 0


class _Parser:
    def __init__(self, root: Path, acks: Path) -> None:
        self.root = str(root)
        self.acks = str(acks)
        self.fs = FileSystem()
        self.names: dict[str, int] = {self.root: 0}
        self.fds: dict[str, _Open | None] = {}
        self.next_ino = 1
        self.ops: list[Op] = []
        self.ack_count = 0

    def emit(self, op: Op) -> None:
        self.ops.append(op)
        self.fs.apply(op)

    def inside(self, path: str) -> bool:
        return path == self.root or path.startswith(self.root + "/")

    def parent_of(self, path: str) -> tuple[int, str]:
        parent, name = os.path.split(path)
        return self.names[parent], name

    def resolve(self, dirfd: str, name: bytes) -> str:
        text = os.fsdecode(name)
        if text.startswith("/"):
            return os.path.normpath(text)
        _, base = _fd(dirfd)
        assert base is not None, f"a relative path needs a known folder: {dirfd}"
        return os.path.normpath(os.path.join(base, text))

    def open(self, path: str, flags: str, fd: str) -> None:
        if path == self.acks:
            self.fds[fd] = _Open(-2, True)
            return
        if not self.inside(path):
            self.fds[fd] = None
            return
        ino = self.names.get(path)
        if ino is None:
            assert O_CREAT in flags, f"opened {path} that the trace never created"
            ino = self.next_ino
            self.next_ino += 1
            parent, name = self.parent_of(path)
            self.names[path] = ino
            self.emit(Op("create", ino=ino, parent=parent, name=name))
        elif "O_TRUNC" in flags and ino not in self.fs.folders:
            self.emit(Op("trunc", ino=ino, size=0))
        self.fds[fd] = _Open(ino, "O_APPEND" in flags)

    def write(self, fd: str, data: bytes, off: int | None) -> None:
        handle = self.fds.get(fd)
        if handle is None:
            return
        if handle.ino == -2:
            self.ack_count = int(data.decode())
            self.emit(Op("ack", size=self.ack_count))
            return
        at = off if off is not None else (
            len(self.fs.files.get(handle.ino, b"")) if handle.append else handle.pos)
        self.emit(Op("write", ino=handle.ino, off=at, data=data))
        if off is None:
            handle.pos = at + len(data)

    def two_paths(self, syscall: str, args: list[str]) -> tuple[str, str]:
        """The full source and target paths of ``rename``/``link`` and their ``*at`` forms."""
        if syscall in ("rename", "link"):
            return (self.resolve("AT_FDCWD", _string(args[0])),
                    self.resolve("AT_FDCWD", _string(args[1])))
        return self.resolve(args[0], _string(args[1])), self.resolve(args[2], _string(args[3]))

    def move(self, old: str, new: str) -> None:
        """Rename every tracked name at or under ``old`` to ``new``."""
        for path in sorted(self.names):
            if path == old or path.startswith(old + "/"):
                self.names[new + path[len(old):]] = self.names.pop(path)

    def line(self, syscall: str, args: list[str], ret: str, ret_path: str | None) -> None:
        if ret.startswith("-"):
            return  # a failed call changed nothing
        if syscall in ("openat", "open", "creat"):
            flags = args[2] if syscall == "openat" else (args[1] if syscall == "open" else O_CREAT)
            assert ret_path is not None, "strace -y names the opened file"
            self.open(os.path.normpath(os.fsdecode(_unescape(ret_path))), flags, ret)
        elif syscall in ("write", "pwrite64"):
            fd, _ = _fd(args[0])
            data = _string(args[1])[:int(ret)]
            self.write(fd, data, int(args[3]) if syscall == "pwrite64" else None)
        elif syscall in ("writev", "pwritev", "pwritev2"):
            fd, _ = _fd(args[0])
            data = b"".join(_unescape(m) for m in re.findall(r'iov_base="(.*?)"', args[1]))
            self.write(fd, data[:int(ret)], int(args[3]) if syscall != "writev" else None)
        elif syscall == "lseek":
            fd, _ = _fd(args[0])
            if self.fds.get(fd) is not None:
                self.fds[fd].pos = int(ret)  # type: ignore[union-attr]
        elif syscall in ("ftruncate", "truncate"):
            if syscall == "truncate":
                path = os.path.normpath(os.fsdecode(_string(args[0])))
                ino = self.names.get(path) if self.inside(path) else None
            else:
                handle = self.fds.get(_fd(args[0])[0])
                ino = None if handle is None else handle.ino
            if ino is not None:
                self.emit(Op("trunc", ino=ino, size=int(args[1])))
        elif syscall in ("fsync", "fdatasync"):
            handle = self.fds.get(_fd(args[0])[0])
            if handle is not None and handle.ino >= 0:
                self.emit(Op("sync", ino=handle.ino))
        elif syscall in ("rename", "renameat", "renameat2"):
            old, new = self.two_paths(syscall, args)
            assert syscall != "renameat2" or "RENAME_EXCHANGE" not in args[4]
            if self.inside(old) and self.inside(new):
                parent, name = self.parent_of(old)
                parent2, name2 = self.parent_of(new)
                self.emit(Op("rename", parent=parent, name=name, parent2=parent2, name2=name2))
                self.names.pop(new, None)
                self.move(old, new)
            else:
                assert not (self.inside(old) or self.inside(new)), (old, new)
        elif syscall in ("link", "linkat"):
            old, new = self.two_paths(syscall, args)
            if self.inside(new):
                parent, name = self.parent_of(new)
                self.names[new] = self.names[old]
                self.emit(Op("link", ino=self.names[old], parent=parent, name=name))
        elif syscall in ("unlink", "unlinkat", "rmdir"):
            path = (self.resolve("AT_FDCWD", _string(args[0])) if syscall != "unlinkat"
                    else self.resolve(args[0], _string(args[1])))
            if self.inside(path):
                parent, name = self.parent_of(path)
                self.names.pop(path)
                self.emit(Op("unlink", parent=parent, name=name))
        elif syscall in ("mkdir", "mkdirat"):
            path = (self.resolve("AT_FDCWD", _string(args[0])) if syscall == "mkdir"
                    else self.resolve(args[0], _string(args[1])))
            if self.inside(path):
                parent, name = self.parent_of(path)
                ino = self.next_ino
                self.next_ino += 1
                self.names[path] = ino
                self.emit(Op("mkdir", ino=ino, parent=parent, name=name))
        elif syscall == "close":
            self.fds.pop(_fd(args[0])[0], None)
        elif syscall in ("dup", "dup2", "dup3") or (
                syscall == "fcntl" and "F_DUPFD" in args[1]):
            self.fds[ret] = self.fds.get(_fd(args[0])[0])


def parse_trace(trace: Path, root: Path, acks: Path) -> tuple[list[Op], FileSystem]:
    """The operations under ``root`` (and ``ack`` marks: writes to ``acks``), and the result.

    ``root`` must be an existing, empty, durable folder when the trace starts.
    """
    parser = _Parser(root, acks)
    pending: dict[str, str] = {}
    for raw in trace.read_text(encoding="ascii").splitlines():
        pid, _, rest = raw.partition(" ")
        rest = rest.lstrip()
        if rest.endswith("<unfinished ...>"):
            pending[pid] = rest[: -len("<unfinished ...>")].rstrip()
            continue
        m = re.match(r"^<\.\.\. \w+ resumed>(.*)$", rest)
        if m is not None:
            rest = pending.pop(pid) + m.group(1)
        if rest.startswith("+++") or rest.startswith("---"):
            continue
        parsed = _LINE.match(f"{pid} {rest}")
        if parsed is None:
            raise ValueError(f"unparsed strace line: {raw[:200]}")
        _, syscall, args, ret, ret_path = parsed.groups()
        parser.line(syscall, _split_args(args), ret, ret_path)
    return parser.ops, parser.fs


def _pieces(op: Op) -> list[Op]:
    """A write cut at 4 KiB page boundaries of the file."""
    out, at = [], op.off
    while at < op.off + len(op.data):
        end = min(op.off + len(op.data), (at // PAGE_BYTES + 1) * PAGE_BYTES)
        out.append(Op("write", ino=op.ino, off=at, data=op.data[at - op.off:end - op.off]))
        at = end
    return out


def _folders_of(op: Op) -> tuple[int, ...]:
    return (op.parent, op.parent2) if op.kind == "rename" else (op.parent,)


def crash_state(ops: list[Op], cut: int, model: str, rng: random.Random) -> FileSystem:
    """The files on disk after a power cut once ``ops[:cut]`` were issued, under ``model``."""
    issued = ops[:cut]
    folders: set[int] = {0}
    for op in issued:
        if op.kind == "mkdir":
            folders.add(op.ino)
    last_sync: dict[int, int] = {}
    for i, op in enumerate(issued):
        if op.kind == "sync":
            last_sync[op.ino] = i
    # the journal is durable up to the last namespace operation a later folder fsync covered
    forced_ns = max((i for i, op in enumerate(issued) if op.is_namespace and any(
        last_sync.get(f, -1) > i for f in _folders_of(op))), default=-1)
    chosen: list[Op] = []
    if model == "strict":
        chosen = [op for op in issued if op.kind in ("write", "trunc") or op.is_namespace]
    elif model in ("prefix", "page-subset"):
        ns_end = rng.randint(forced_ns + 1, cut)
        kept: dict[int, int] = {}  # per file: how many unsynced data ops land (prefix)
        keep_p = rng.choice((0.2, 0.5, 0.8))
        for i, op in enumerate(issued):
            if op.is_namespace:
                if i < ns_end:
                    chosen.append(op)
            elif op.kind in ("write", "trunc"):
                if i < last_sync.get(op.ino, -1):
                    chosen.append(op)
                elif model == "prefix":
                    if op.ino not in kept:
                        later = sum(1 for o in issued[i:] if o.kind in ("write", "trunc")
                                    and o.ino == op.ino)
                        kept[op.ino] = rng.randint(0, later)
                    if kept[op.ino] > 0:
                        kept[op.ino] -= 1
                        chosen.append(op)
                elif op.kind == "trunc":
                    if rng.random() < keep_p:
                        chosen.append(op)
                else:
                    chosen.extend(p for p in _pieces(op) if rng.random() < keep_p)
    elif model == "ordered":
        commit = rng.randint(forced_ns + 1, cut)
        sizes: dict[int, int] = {}  # the durable size of each file as the replay goes
        for i, op in enumerate(issued):
            if i < commit or (op.kind in ("write", "trunc")
                              and i < last_sync.get(op.ino, -1)):
                if op.is_namespace or op.kind in ("write", "trunc"):
                    chosen.append(op)
                if op.kind == "write":
                    sizes[op.ino] = max(sizes.get(op.ino, 0), op.off + len(op.data))
                elif op.kind == "trunc":
                    sizes[op.ino] = op.size
            elif op.kind == "write":  # unsynced: in-place pages may land, growth may not
                size = sizes.get(op.ino, 0)
                chosen.extend(p for p in _pieces(op)
                              if p.off + len(p.data) <= size and rng.random() < 0.5)
    else:
        raise ValueError(f"unknown write-back model {model!r}")
    fs = FileSystem()
    for op in chosen:
        if op.is_namespace and op.kind != "unlink" and op.kind != "rename" and \
                op.parent not in fs.folders:
            continue  # its folder's mkdir did not land
        if op.kind == "rename" and (op.parent not in fs.folders or op.parent2 not in fs.folders):
            continue
        if op.kind == "unlink" and op.parent not in fs.folders:
            continue
        fs.apply(op)
    return fs


def acknowledged(ops: list[Op], cut: int) -> int:
    """The event count acknowledged by the writer before ``ops[cut]`` was issued."""
    return max((op.size for op in ops[:cut] if op.kind == "ack"), default=0)
