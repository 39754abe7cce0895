"""`kimi-batch server smoke`: the installed llama-server loads the demo model and answers, or fails now.

`make setup` ends with it. A binary built for instructions this CPU cannot run (llama.cpp's AMX
kernels on some Xeons) dies by SIGSEGV or SIGILL at its first computation; without this check
that shows up minutes later inside a run. The smoke server is a child of this process on a free
loopback port with one slot and a small context, never the resident server, and is always stopped.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import httpx
from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.llama.exceptions import ServerKilledError, ServerSpawnError
from kimi_batch.llama.exits import describe_exit, signal_name
from kimi_batch.llama.spec import ServerSpec, available_cpus
from kimi_batch.paths import private_dir
from kimi_batch.settings import FlashAttention

SMOKE_TIMEOUT_S = 120.0
SMOKE_TOKENS = 4
SMOKE_PROMPT = "The capital of France is"
# After a failed request, how long the server gets to die (and say by which signal).
_DEATH_GRACE_S = 5.0
_STOP_GRACE_S = 10.0


class SmokeResult(BaseModel):
    """What `kimi-batch server smoke` reports when the binary works."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    binary: str
    model: str
    completion_tokens: int = Field(ge=0)
    text: str
    load_s: float = Field(ge=0, description="Spawn to a healthy /health.")
    wall_s: float = Field(ge=0, description="Spawn to stopped.")
    log_path: str


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Smoke:
    def __init__(self, spec: ServerSpec, log_path: Path, deadline: float) -> None:
        self.spec = spec
        self.log_path = log_path
        self.deadline = deadline
        self.http = httpx.Client(base_url=spec.base_url, timeout=10.0)
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(
                spec.argv(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # a Ctrl-C of `make setup` is ours to handle
            )

    def failed(self, returncode: int) -> ServerSpawnError:
        message = describe_exit(
            returncode,
            what=f"llama-server smoke test: {self.spec.binary}",
            log_path=self.log_path,
        )
        name = signal_name(returncode)
        return ServerKilledError(message, signal_name=name) if name else ServerSpawnError(message)

    def check_alive(self) -> None:
        returncode = self.process.poll()
        if returncode is not None:
            raise self.failed(returncode)

    def timed_out(self, what: str) -> ServerSpawnError:
        return ServerSpawnError(
            f"llama-server smoke test: {self.spec.binary} {what} within the time limit; "
            f"log: {self.log_path}"
        )

    def wait_healthy(self) -> None:
        while time.monotonic() < self.deadline:
            self.check_alive()
            try:
                if self.http.get("/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise self.timed_out("did not become healthy")

    def complete(self) -> tuple[str, int]:
        try:
            response = self.http.post(
                "/completion",
                json={"prompt": SMOKE_PROMPT, "n_predict": SMOKE_TOKENS, "temperature": 0.0},
                timeout=max(1.0, self.deadline - time.monotonic()),
            )
        except httpx.TimeoutException:
            raise self.timed_out("did not answer a completion") from None
        except httpx.HTTPError:
            self.wait_death()
            raise
        if response.status_code != 200:
            self.check_alive()
            raise ServerSpawnError(
                f"llama-server smoke test: {self.spec.binary} answered HTTP "
                f"{response.status_code} to a completion; log: {self.log_path}"
            )
        body = response.json()
        return str(body.get("content", "")), int(body.get("tokens_predicted", 0))

    def wait_death(self) -> None:
        """A dropped connection is most likely the server dying: name how, if it does."""
        try:
            returncode = self.process.wait(timeout=_DEATH_GRACE_S)
        except subprocess.TimeoutExpired:
            return
        raise self.failed(returncode)

    def stop(self) -> None:
        self.http.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _smoke_spec(
    binary: Path,
    model: Path,
    work_dir: Path,
    *,
    cache_ram_mib: int | None,
    flash_attn: FlashAttention | None,
) -> ServerSpec:
    """A small server: two threads, one 1,024-token slot, a few tokens, no metrics."""
    return ServerSpec(
        binary=binary,
        model=model,
        port=_free_loopback_port(),
        threads=min(2, available_cpus()),
        ctx=1024,
        parallel=1,
        batch=512,
        ubatch=256,
        n_predict=SMOKE_TOKENS,
        cache_ram_mib=cache_ram_mib,
        slot_save_path=private_dir(work_dir / "slots"),
        metrics=False,
        flash_attn=flash_attn,
    )


def smoke_test(
    binary: Path,
    model: Path,
    work_dir: Path,
    *,
    cache_ram_mib: int | None = None,
    flash_attn: FlashAttention | None = None,
    timeout_s: float = SMOKE_TIMEOUT_S,
) -> SmokeResult:
    """Start `binary` on `model`, wait for health, ask for a few tokens, stop it. `flash_attn`:
    the server's, so a build that refuses the flag fails here, not at the night's start.

    Raises `ServerKilledError` (one line naming the signal, the binary and what to do) when the
    server dies by a signal, `ServerSpawnError` for any other failure; bounded by `timeout_s`.
    """
    private_dir(work_dir)
    spec = _smoke_spec(binary, model, work_dir, cache_ram_mib=cache_ram_mib, flash_attn=flash_attn)
    log_path = work_dir / "llama-server.log"
    started = time.monotonic()
    try:
        smoke = _Smoke(spec, log_path, started + timeout_s)
    except OSError as error:
        raise ServerSpawnError(f"llama-server smoke test: cannot run {binary}: {error}") from None
    try:
        smoke.wait_healthy()
        load_s = time.monotonic() - started
        try:
            text, tokens = smoke.complete()
        except httpx.HTTPError as error:
            raise ServerSpawnError(
                f"llama-server smoke test: {binary} dropped a completion ({error}); log: {log_path}"
            ) from None
    finally:
        smoke.stop()
    if tokens <= 0:
        raise ServerSpawnError(
            f"llama-server smoke test: {binary} answered a completion with no tokens; "
            f"log: {log_path}"
        )
    return SmokeResult(
        binary=str(binary),
        model=str(model),
        completion_tokens=tokens,
        text=text,
        load_s=round(load_s, 2),
        wall_s=round(time.monotonic() - started, 2),
        log_path=str(log_path),
    )
