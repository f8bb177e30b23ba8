"""Paths and operating-system faults, looked at in one place.

Every path a command is given goes through `check_path` (the CLI does it for each path argument, before the
command runs; resolvers do it for the strings they turn into paths, a --data source or a --target) and is
resolved by `resolve_path`: a symlink loop, a dangling symlink, a path through a file or a folder that may not
be searched is a what/expected/found/fix error naming the path, never a RuntimeError or an OSError traceback.
An OSError that still escapes a command (a full disk, a read-only folder, a port in use) becomes `os_error`'s
message, naming the path and the errno, with how to fix it.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

from eaglewire.errors import EaglewireError


_OS_FIXES = {  # errno name -> (what it means, what was expected, how to fix it)
    "ENOSPC": (
        "the disk is full",
        "room on the disk for the output",
        "free space on that disk (or write "
        "elsewhere) and run the command again; an earlier output there was left as it was",
    ),
    "EDQUOT": ("the disk quota is used up", "room in your quota", "free space within your quota and run again"),
    "EROFS": ("the file system is read-only", "a writable folder", "write to a writable folder"),
    "EACCES": (
        "permission denied",
        "a path this user may read (or write, for an output)",
        "check the permissions of that path and the folders above it, or use another",
    ),
    "EPERM": ("the operation is not permitted", "a path this user may change", "check its permissions and owner"),
    "ELOOP": (
        "a symlink loop (a link that leads back to itself)",
        "a path that leads to a file or folder",
        "point at the real file or folder, or fix the link",
    ),
    "ENAMETOOLONG": ("a name too long for the file system", "a shorter path", "use a shorter path"),
    "ENOTDIR": ("a part of the path is a file, not a folder", "folders above the last name", "check the path"),
    "EISDIR": ("a folder where a file was expected", "a file", "name a file, not a folder"),
    "ENOENT": ("no such file or folder", "an existing path", "check the path"),
    "EMFILE": ("too many open files", "a free file descriptor", "raise the open-file limit (ulimit -n)"),
    "EIO": (
        "an input/output error from the device",
        "a readable disk",
        "check the disk (dmesg); restore the file from a copy",
    ),
    "EADDRINUSE": ("the address is already in use", "a free port", "stop the program using it, or pick another --port"),
    "EADDRNOTAVAIL": (
        "not an address of this machine",
        "one of this machine's addresses (127.0.0.1, 0.0.0.0, ...)",
        "check --host",
    ),
    "gaierror": (
        "the host name does not resolve to an address",
        "an address or a resolvable host name",
        "check --host",
    ),
}


def os_error(err: OSError, role: str = "") -> EaglewireError:
    """An OSError as an EaglewireError naming the path (or address), the fault and how to fix it; `role`: what
    the path is to the command (an option name, "conversation source")."""
    name = (
        type(err).__name__
        if isinstance(err, socket.gaierror)
        else errno.errorcode.get(err.errno or 0, type(err).__name__)
    )
    meaning, expected, fix = _OS_FIXES.get(
        name, (err.strerror or str(err), "the operation to succeed", "check the path and the disk")
    )
    where = " -> ".join(str(f) for f in (err.filename, err.filename2) if f is not None)
    subject = " ".join(x for x in (role, where) if x) or "a file operation"
    return EaglewireError(f"{subject}: {meaning}", expected=expected, found=f"{name}: {err.strerror or err}", fix=fix)


def check_path(path: Path | str, role: str = "path") -> Path:
    """The one look at a path given to a command, before anything uses it: a symlink loop, a dangling symlink,
    a path through a file, a name too long or a folder that may not be searched is an error naming the path
    and the fault. A missing path is not refused here (each command says what it expected there)."""
    p = Path(path)
    try:
        os.stat(p)
    except FileNotFoundError:
        if os.path.islink(p):  # the link itself is there, what it names is not
            raise EaglewireError(
                f"{role} {p} is a dangling symlink",
                expected="a link to an existing file or folder",
                found=f"{p} -> {os.readlink(p)}, which does not exist",
                fix="point at the real file or folder, or re-create the link's target",
            ) from None
    except OSError as err:
        raise os_error(_named(err, p), role) from None
    except ValueError as err:  # an embedded NUL byte
        raise EaglewireError(
            f"{role} is not a usable path",
            expected="a path without NUL bytes",
            found=repr(str(p))[:200] + f" ({err})",
            fix="check the argument",
        ) from None
    return p


def resolve_path(path: Path | str, role: str = "path") -> Path:
    """`check_path`, then the absolute path with every symlink followed (what outputs compare)."""
    p = check_path(path, role)
    try:
        return p.resolve()
    except RuntimeError:  # Python < 3.13 reports a loop met while resolving (a parent that loops) this way
        raise os_error(OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(p)), role) from None
    except OSError as err:
        raise os_error(_named(err, p), role) from None


def _named(err: OSError, path: Path) -> OSError:
    """`err` naming `path` (the path as given: os.stat names it already, a resolve names a component)."""
    return OSError(err.errno, err.strerror, str(path)) if err.errno else err
