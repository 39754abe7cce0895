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
    """The source files whose functions were called while the trace ran."""

    files: set[str] = field(default_factory=set)
    # The functions called in each file: what to look at when a module should not be there.
    functions: dict[str, set[str]] = field(default_factory=dict)

    @property
    def modules(self) -> list[str]:
        """The counted project modules, as paths under `kimi_batch/` (a top-level module such as
        `paths.py` is a package of its own)."""
        found = set()
        for name in self.files:
            path = Path(name).resolve()
            if path.is_relative_to(PACKAGE):
                module = path.relative_to(PACKAGE).as_posix()
                if module.split("/")[0] not in NOT_COUNTED:
                    found.add(module)
        return sorted(found)

    @property
    def packages(self) -> list[str]:
        return sorted({module.split("/")[0] for module in self.modules})

    def report(self) -> str:
        by_module = {
            Path(name).resolve().relative_to(PACKAGE).as_posix(): names
            for name, names in self.functions.items()
            if Path(name).resolve().is_relative_to(PACKAGE)
        }
        return (
            f"{len(self.modules)} modules in {len(self.packages)} packages: {self.packages}\n"
            + (
                "\n".join(
                    f"{module}: {', '.join(sorted(by_module[module]))}" for module in self.modules
                )
            )
        )


@contextmanager
def traced() -> Iterator[ModuleTrace]:
    """Trace the block, in this thread and in the threads it starts (a profile reaches only the
    threads started after it, so start servers and pools inside the block)."""
    trace = ModuleTrace()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            trace.files.add(code.co_filename)
            trace.functions.setdefault(code.co_filename, set()).add(code.co_name)

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        yield trace
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
