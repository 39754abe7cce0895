"""Which of the project's modules run in a block (issue 46: a feature is one package, so one
partition's or one line's trip crosses few of them). `engine/` and `llama/` are not counted."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import kimi_batch

PACKAGE = Path(kimi_batch.__file__).resolve().parent
NOT_COUNTED = ("engine", "llama")


@dataclass
class ModuleTrace:
    """The functions called while the trace ran, by source file."""

    functions: dict[str, set[str]] = field(default_factory=dict)

    def _counted(self) -> dict[str, set[str]]:
        """The counted project modules, as paths under `kimi_batch/` (a top-level module such as
        `paths.py` is a package of its own), with the functions called in each."""
        found: dict[str, set[str]] = {}
        for name, names in self.functions.items():
            path = Path(name).resolve()
            if path.is_relative_to(PACKAGE):
                module = path.relative_to(PACKAGE).as_posix()
                if module.split("/")[0] not in NOT_COUNTED:
                    found.setdefault(module, set()).update(names)
        return found

    @property
    def modules(self) -> list[str]:
        return sorted(self._counted())

    @property
    def packages(self) -> list[str]:
        return sorted({module.split("/")[0] for module in self._counted()})

    def report(self) -> str:
        """The count, then each module with the functions it ran (what to look at when a module
        should not be on the walk)."""
        counted = self._counted()
        packages = self.packages
        lines = [f"{module}: {', '.join(sorted(counted[module]))}" for module in sorted(counted)]
        return f"{len(counted)} modules in {len(packages)} packages: {packages}\n" + "\n".join(
            lines
        )


@contextmanager
def traced() -> Iterator[ModuleTrace]:
    """Trace the block, in this thread and in the threads it starts (a profile reaches only the
    threads started after it, so start servers and pools inside the block)."""
    trace = ModuleTrace()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            trace.functions.setdefault(code.co_filename, set()).add(code.co_name)

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        yield trace
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
