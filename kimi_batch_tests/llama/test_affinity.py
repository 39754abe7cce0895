"""CPU lists as the kernel and taskset write them, and the cores left to everything else."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kimi_batch.llama.affinity import CpuListError, format_cpu_list, parse_cpu_list, the_rest


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-12", set(range(13))),
        ("0,2,4-6", {0, 2, 4, 5, 6}),
        (" 3 ", {3}),
        ("1-1,1", {1}),
    ],
)
def test_a_cpu_list_reads_as_its_set(text: str, cpus: set[int]) -> None:
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize("text", ["", "a-b", "5-2", "-1", "0-", ","])
def test_a_malformed_cpu_list_is_refused(text: str) -> None:
    with pytest.raises(CpuListError):
        parse_cpu_list(text)


@pytest.mark.parametrize("text", ["\u0661", "1_5", "0-1_2", "+1", "\u00b2", "0-\u0663", "3\t"])
def test_a_cpu_number_is_ascii_digits_only(text: str) -> None:
    # int() reads '\u0661' (Arabic-Indic one) as 1, '1_5' as 15 and '+1' as 1; taskset and the
    # kernel's cpulist format take ASCII digits only, so the server was pinned to CPUs the list
    # never named.
    with pytest.raises(CpuListError, match="not a CPU list"):
        parse_cpu_list(text)


def test_a_set_is_written_back_with_its_ranges_joined() -> None:
    assert format_cpu_list(frozenset({0, 1, 2, 5, 7, 8})) == "0-2,5,7-8"
    assert parse_cpu_list(format_cpu_list(frozenset(range(13)))) == set(range(13))


def test_the_rest_is_what_the_server_does_not_hold_and_never_empty() -> None:
    allowed = frozenset(os.sched_getaffinity(0))
    first = min(allowed)
    assert the_rest(frozenset({first})) == (allowed - {first} or allowed)
    assert the_rest(allowed) == allowed  # nothing left: a process pinned to no CPU cannot run


def test_a_process_pinned_to_the_rest_and_its_children_keep_off_the_server_cpus() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    rest = allowed[1:] or allowed  # one CPU: it stays where it is
    code = (
        "import os, subprocess, sys\n"
        "from kimi_batch.llama.affinity import pin_to_the_rest\n"
        f"pin_to_the_rest(frozenset({{{allowed[0]}}}))\n"
        "child = subprocess.run([sys.executable, '-c', "
        "'import os; print(sorted(os.sched_getaffinity(0)))'], capture_output=True, text=True)\n"
        "print(sorted(os.sched_getaffinity(0)), child.stdout.strip())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"{rest} {rest}"
