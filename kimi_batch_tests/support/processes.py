"""The processes a test started, found by the state dir they were given, and their state."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = [
    "descendants",
    "keep_niceness",
    "kernel_thread",
    "process_state",
    "processes_naming",
]

# /proc/PID/stat's flags bit of a kernel thread (include/linux/sched.h).
_PF_KTHREAD = 0x00200000


def keep_niceness(pid: int) -> None:
    """Give the autogroup of `pid`, a process started in a session of its own, this process's
    niceness: the kernel starts a new session's group at nice 0, so a stack that make test's
    niced second tier starts would compete at full weight with the tier it yields to. A no-op
    on a kernel without autogroups."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(f"{os.nice(0)}\n")


def process_state(pid: int) -> str | None:
    """The one-letter state of a process (`Z`: a zombie), from /proc; None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def kernel_thread() -> int:
    """The pid of a kernel thread (its command line reads empty for good); fails where the
    process namespace shows none."""
    for entry in sorted(Path("/proc").iterdir(), key=lambda path: path.name):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.name.isdigit() and int(fields[6]) & _PF_KTHREAD:
            return int(entry.name)
    raise AssertionError("no kernel thread is visible in this process namespace")


def processes_naming(home: Path | str, *, besides: int | None = None) -> dict[int, str]:
    """pid -> command line of every live process whose arguments or environment name `home`
    (a state dir, or any other marker string) (but `besides`)."""
    marker = str(home).encode()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == besides:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        state = process_state(int(entry.name))
        if state not in (None, "Z") and (marker in cmdline or marker in environ):
            found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    return found


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc), children first."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # "pid (comm) state ppid ...": comm may hold spaces, so split after its ")".
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
    below = [child for child, parent in parents.items() if parent == pid]
    return [grandchild for child in below for grandchild in descendants(child)] + below
