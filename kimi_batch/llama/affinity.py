"""The server's cores are the server's: a CPU list (`0-12`, `0-5,8`) parsed, and the cores left
to everything else.

On the target, llama-server's decode saturates at 13-14 threads of 16 cores; anything else that
wakes up on those cores (Dagster's run worker, its daemon and code servers, Trino) costs decode
speed. `KIMI_BATCH_LLAMA_CPUS` pins the server to a set (its threads default to the set's size)
and the processes that load the code location to the rest (`pin_to_the_rest`).
"""

from __future__ import annotations

import os


class CpuListError(ValueError):
    """A CPU list that is not `N`, `N-M` or a comma-separated mix of them."""


def parse_cpu_list(text: str) -> frozenset[int]:
    """`0-12` / `0,2,4-6` (the kernel's and taskset's list format) as a set of CPU numbers."""
    cpus: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        low, dash, high = part.partition("-")
        # ASCII digits only, as taskset and the kernel's cpulist format read them: int() also
        # takes '\u0661' (Arabic-Indic one, as 1), '1_5' (as 15), a sign and surrounding whitespace.
        if not all(n.isascii() and n.isdigit() for n in ((low, high) if dash else (low,))):
            raise CpuListError(f"not a CPU list: {text!r} (expected e.g. 0-12 or 0,2,4-6)")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise CpuListError(f"not a CPU range: {part!r} in {text!r}")
        cpus.update(range(first, last + 1))
    if not cpus:
        raise CpuListError(f"empty CPU list: {text!r}")
    return frozenset(cpus)


def format_cpu_list(cpus: frozenset[int]) -> str:
    """The set in the list format, ranges joined: {0,1,2,5} -> `0-2,5`."""
    ordered, parts = sorted(cpus), []
    start = previous = ordered[0]
    for cpu in [*ordered[1:], None]:
        if cpu is not None and cpu == previous + 1:
            previous = cpu
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if cpu is not None:
            start = previous = cpu
    return ",".join(parts)


def the_rest(server_cpus: frozenset[int]) -> frozenset[int]:
    """The CPUs this process may use that the server does not hold (all of them if none is
    left: a process pinned to no CPU could not run)."""
    allowed = frozenset(os.sched_getaffinity(0))
    rest = allowed - server_cpus
    return rest or allowed


def pin_to_the_rest(server_cpus: frozenset[int]) -> frozenset[int]:
    """Move this process (and what it starts later) off the server's CPUs; the set it now has."""
    rest = the_rest(server_cpus)
    os.sched_setaffinity(0, rest)
    return rest
