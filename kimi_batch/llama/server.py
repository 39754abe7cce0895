"""The resident llama-server: a spec, its argv, and a manager that attaches before it ever spawns.

On the target a model load takes minutes, so the server is started once, detached (it outlives the
run and the CLI that started it), and every later run attaches to it. A file lock in the state dir
makes concurrent starts yield one server; a pid file (with the process start time, so a reused
pid is not mistaken for ours) and a spec file describe what runs. The server's parent is a small
waiter (`exits.WAITER_SOURCE`) that records how it ended, so a server killed by a signal is
reported as such ("killed by SIGSEGV during the model load / first computation"), not as "exited".

An answer on the port is not proof that the server started here gave it: another process may hold
the port (an unrelated service, another state dir's server that won a race for it, or one sharing
it through SO_REUSEPORT, which llama.cpp's HTTP library set on Linux). A start refuses a taken
port before it spawns, and the wait for health takes an answer only from a port its own server
listens on alone; else it fails in one line naming the port (`_port_taken`), and never records a
pid that is not the server's.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

from filelock import FileLock
from pydantic import ValidationError

from kimi_batch.llama.client import LlamaClient
from kimi_batch.llama.exceptions import ServerKilledError, ServerSpawnError, SpecMismatchError
from kimi_batch.llama.exits import (
    ExitRecord,
    describe_exit,
    read_exit_record,
    signal_name,
    wait_for_exit_record,
)
from kimi_batch.llama.memory import check_memory
from kimi_batch.llama.process import (
    PidRecord,
    port_in_use,
    port_owners,
    probe,
    process_start_ticks,
    running,
    signal_process,
    spawn_detached,
)
from kimi_batch.llama.server_state import ServerProps
from kimi_batch.llama.spec import ServerHandle, ServerSpec, ServerStatus
from kimi_batch.llama.urls import redact_url
from kimi_batch.paths import private_dir
from kimi_batch.settings import DEFAULT_FROZEN_AFTER_S, DEFAULT_LOAD_TIMEOUT_S

logger = logging.getLogger(__name__)

STOP_GRACE_S = 20.0


class ResidentServer:
    """Attach to, or spawn once, the llama-server described by a spec. Never stopped by a run."""

    def __init__(
        self,
        spec: ServerSpec,
        state_dir: Path,
        *,
        api_key: str | None = None,
        load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S,
        frozen_after_s: float = DEFAULT_FROZEN_AFTER_S,
    ) -> None:
        self.spec = spec
        self.state_dir = state_dir
        self.api_key = api_key
        self.load_timeout_s = load_timeout_s
        self.frozen_after_s = frozen_after_s
        self.pid_path = state_dir / "server.pid"
        self.spec_path = state_dir / "server.spec.json"
        self.log_path = state_dir / "server.log"
        self.exit_path = state_dir / "server.exit.json"
        self._lock = FileLock(str(state_dir / "server.lock"))

    @property
    def base_url(self) -> str:
        return self.spec.base_url

    def client(self, **kwargs: object) -> LlamaClient:
        return LlamaClient(self.base_url, api_key=self.api_key, **kwargs)  # type: ignore[arg-type]

    # -- state files -----------------------------------------------------------------------

    def _read_pid(self) -> PidRecord | None:
        try:
            return PidRecord.model_validate_json(self.pid_path.read_text())
        except (OSError, ValidationError):
            return None

    def _read_spec(self) -> ServerSpec | None:
        try:
            return ServerSpec.model_validate_json(self.spec_path.read_text())
        except (OSError, ValidationError):
            return None

    def _live_pid(self) -> int | None:
        record = self._read_pid()
        return record.pid if record is not None and running(record) else None

    def _clear_state(self) -> None:
        self.pid_path.unlink(missing_ok=True)
        self.spec_path.unlink(missing_ok=True)

    def _died(self, record: PidRecord) -> ExitRecord | None:
        """How the server of `record` ended, if its waiter saw it (None: unknown)."""
        return wait_for_exit_record(self.exit_path, record.pid)

    def _death_message(self, record: PidRecord, ended: ExitRecord) -> str:
        serving_s = ended.ended_at - record.healthy_at if record.healthy_at is not None else None
        return describe_exit(
            ended.returncode,
            what=f"llama-server (pid {record.pid})",
            log_path=self.log_path,
            serving_s=serving_s,
        )

    def _previous_exit(self) -> str | None:
        """A managed server that died on its own (not stopped): how, logged once, then forgotten."""
        record = self._read_pid()
        if record is None:
            return None
        ended = read_exit_record(self.exit_path, record.pid)
        if ended is None:
            return None
        message = self._death_message(record, ended)
        logger.warning("the resident %s", message)
        return message

    def _log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- lifecycle -------------------------------------------------------------------------

    def ensure_running(self) -> ServerHandle:
        """Attach to the healthy server with this spec, or start it; raise on another spec."""
        private_dir(self.state_dir)
        with self._lock.acquire(timeout=self.load_timeout_s + 60):
            pid = self._live_pid()
            if pid is not None:
                running = self._read_spec()
                if running != self.spec:
                    raise SpecMismatchError(
                        f"llama-server pid {pid} already runs with a different spec; it is left "
                        f"running. Stop it first (kimi-batch server stop).\n"
                        f"  running:   {running.describe() if running else '(unknown)'}\n"
                        f"  requested: {self.spec.describe()}"
                    )
                return self._wait_healthy(pid, spawned=False)
            previous = self._previous_exit()
            self._clear_state()
            state, props = probe(self.base_url, self.api_key)
            if state != "down":
                return self._adopt_foreign(state, props)
            if port_in_use(self.spec.host, self.spec.port):
                raise ServerSpawnError(
                    self._port_taken("by a process that answers as no llama-server, and that")
                )
            return self._spawn().model_copy(update={"previous_exit": previous})

    def _port_taken(self, how: str) -> str:
        """The one line a start fails with when another process holds the server's port."""
        return (
            f"port {self.spec.port} on {self.spec.host} is taken {how} kimi_batch did not start "
            f"from {self.state_dir} (left running): stop it, or set KIMI_BATCH_LLAMA_PORT "
            "to a free port"
        )

    def _adopt_foreign(self, state: str, props: ServerProps | None) -> ServerHandle:
        """Something we did not start answers on the port: attach only if it serves our model."""
        if state == "loading":
            props = self._wait_props()
        assert props is not None
        if not self._serves_spec(props):
            raise SpecMismatchError(
                f"another llama-server answers at {self.base_url} with a different spec "
                f"(not started by kimi_batch; left running).\n"
                f"  running:   model={props.model_path} slots={props.total_slots} "
                f"ctx/slot={props.n_ctx}\n"
                f"  requested: {self.spec.describe()}"
            )
        logger.info("attached to an unmanaged llama-server at %s", self.base_url)
        return ServerHandle(
            base_url=self.base_url,
            pid=None,
            spawned=False,
            slots=props.total_slots,
            model=self.spec.model_alias,
        )

    def _wait_props(self) -> ServerProps:
        deadline = time.monotonic() + self.load_timeout_s
        while time.monotonic() < deadline:
            state, props = probe(self.base_url, self.api_key)
            if state == "ok" and props is not None:
                return props
            time.sleep(0.5)
        raise ServerSpawnError(f"{self.base_url} still loading after {self.load_timeout_s:.0f} s")

    def _spawn(self) -> ServerHandle:
        # Refuse a config that cannot fit before the load fills the page cache and the OOM
        # killer picks the server minutes later.
        estimate = check_memory(
            self.spec.model,
            ctx=self.spec.ctx,
            ubatch=self.spec.ubatch,
            cache_ram_mib=self.spec.cache_ram_mib,
            parallel=self.spec.parallel,
            flash_attn=self.spec.flash_attn,
            extra_args=self.spec.extra_args,
        )
        logger.info("memory check: %s", estimate.describe())
        private_dir(self.spec.slot_save_path)
        env = dict(os.environ)
        env.pop("LLAMA_API_KEY", None)
        if self.api_key:
            # The key goes through the environment: argv is world-readable in /proc.
            env["LLAMA_API_KEY"] = self.api_key
        argv = self.spec.argv()
        with self.log_path.open("a") as log:
            log.write(f"\n=== kimi_batch spawn {time.strftime('%Y-%m-%dT%H:%M:%S')}: ")
            log.write(" ".join(argv) + "\n")
        self.exit_path.unlink(missing_ok=True)
        started_at = time.time()
        pid = spawn_detached(argv, env, self.log_path, self.exit_path, cpus=self.spec.cpus)
        ticks = process_start_ticks(pid)
        record = PidRecord(pid=pid, start_ticks=ticks or 0, started_at=started_at)
        if ticks is None:
            self._raise_exited(record, at_once=True)
        self.spec_path.write_text(self.spec.model_dump_json(indent=2))
        self.pid_path.write_text(record.model_dump_json())
        logger.info("spawned llama-server pid %d: %s", pid, " ".join(argv))
        return self._wait_healthy(pid, spawned=True)

    def _raise_exited(self, record: PidRecord, *, at_once: bool = False) -> None:
        """The server died while we waited for it: a signal in one line, else the log tail."""
        self._clear_state()
        ended = self._died(record)
        if ended is not None and ended.returncode < 0:
            raise ServerKilledError(
                self._death_message(record, ended),
                signal_name=signal_name(ended.returncode) or "",
            )
        if port_in_use(self.spec.host, self.spec.port):  # it could not bind: another holds it
            raise ServerSpawnError(
                f"llama-server pid {record.pid} exited: " + self._port_taken("by another process")
            )
        code = f" with code {ended.returncode}" if ended is not None else ""
        what = "llama-server exited at once" if at_once else f"llama-server pid {record.pid} exited"
        raise ServerSpawnError(f"{what}{code}:\n{self._log_tail()}")

    def _mark_healthy(self, pid: int) -> None:
        record = self._read_pid()
        if record is not None and record.pid == pid and record.healthy_at is None:
            self.pid_path.write_text(
                record.model_copy(update={"healthy_at": time.time()}).model_dump_json()
            )

    def _wait_healthy(self, pid: int, *, spawned: bool) -> ServerHandle:
        deadline = time.monotonic() + self.load_timeout_s
        # /health is answered beside the decode loop, even mid-prefill: a server that served
        # before and now answers nothing for `frozen_after_s` is frozen (SIGSTOP, wedged):
        # replace it.
        record, answered = self._read_pid(), time.monotonic()
        served = record if not spawned and record is not None and record.healthy_at else None
        while time.monotonic() < deadline:
            if served is not None and time.monotonic() - answered > self.frozen_after_s:
                logger.warning("llama-server pid %d answers nothing: frozen, replacing it", pid)
                self._kill_and_clear(served)
                return self._spawn()
            if process_start_ticks(pid) is None:
                record = self._read_pid()
                if record is None or record.pid != pid:
                    record = PidRecord(pid=pid, start_ticks=0, started_at=time.time())
                self._raise_exited(record)
            state, props = probe(self.base_url, self.api_key)
            answered = time.monotonic() if state != "down" else answered
            if state == "ok" and props is not None:
                self._refuse_foreign_answer(pid, props, spawned=spawned)
                self._mark_healthy(pid)
                return ServerHandle(
                    base_url=self.base_url,
                    pid=pid,
                    spawned=spawned,
                    slots=props.total_slots,
                    model=self.spec.model_alias,
                )
            time.sleep(0.25)
        raise ServerSpawnError(
            f"llama-server pid {pid} not healthy after {self.load_timeout_s:.0f} s "
            f"(raise the load timeout for large models):\n{self._log_tail()}"
        )

    def _refuse_foreign_answer(self, pid: int, props: ServerProps, *, spawned: bool) -> None:
        """Raise unless the healthy answer came from server `pid`: its session listens on the
        port, and no other process does beside it. Where /proc cannot tell, the answer must name
        our model and slots. A server this call spawned is stopped again (it would serve beside
        the other, or is dying on the taken port); one that ran before is left running."""
        owners = port_owners(self.spec.port, pid)
        if owners is None:
            if self._serves_spec(props):
                return
            how = f"by a server of model {props.model_path} ({props.total_slots} slots) that"
        elif owners.ours and not owners.others:
            return
        elif owners.ours:
            how = f"beside llama-server pid {pid} (SO_REUSEPORT) by another process that"
        else:
            how = "by another process that"
        record = self._read_pid()
        if spawned and record is not None and record.pid == pid:
            self._kill_and_clear(record)
            how = f"(llama-server pid {pid}, just spawned, was stopped again) {how}"
        raise ServerSpawnError(self._port_taken(how))

    def _serves_spec(self, props: ServerProps) -> bool:
        """Whether a server's /props name this spec's model file and slot count."""
        same_model = Path(props.model_path).name == self.spec.model.name
        return same_model and props.total_slots == self.spec.slots

    def restart(self, *, min_age_s: float = 0.0) -> ServerHandle:
        """Kill the server this state dir started and start it again (a hung server).

        SIGKILL, because a stopped (SIGSTOP) or wedged process never acts on SIGTERM, and the
        kernel delivers SIGKILL to a stopped process too. A server younger than `min_age_s` was
        just (re)started by another run that saw the same hang: it is kept, not killed twice.
        A server kimi_batch did not start is never killed: that falls back to `ensure_running`.
        """
        private_dir(self.state_dir)
        with self._lock.acquire(timeout=self.load_timeout_s + 60):
            record = self._read_pid()
            pid = self._live_pid()
            if pid is None or record is None:
                logger.warning("no managed llama-server to restart at %s", self.base_url)
            elif time.time() - record.started_at < min_age_s:
                logger.info(
                    "llama-server pid %d was started %.0f s ago: kept",
                    pid,
                    time.time() - record.started_at,
                )
                return self._wait_healthy(pid, spawned=False)
            else:
                logger.warning("killing llama-server pid %d (hung) to restart it", pid)
                self._kill_and_clear(record)
        return self.ensure_running()

    def _kill_and_clear(self, record: PidRecord) -> None:
        signal_process(record, signal.SIGKILL)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and running(record):
            time.sleep(0.05)
        self._clear_state()

    def status(self) -> ServerStatus:
        pid = self._live_pid()
        spec = self._read_spec() if pid is not None else None
        record = self._read_pid() if pid is not None else None
        state, props = probe(self.base_url, self.api_key)
        return ServerStatus(
            running=pid is not None or state != "down",
            healthy=state == "ok",
            pid=pid,
            base_url=self.base_url,
            model=(spec or self.spec).model_alias if pid is not None or props else None,
            threads=(spec or self.spec).effective_threads()[0] if pid is not None else None,
            slots=props.total_slots if props else (spec.slots if spec else None),
            managed=pid is not None,
            log_path=str(self.log_path) if self.log_path.exists() else None,
            started_at=record.started_at if record else None,
        )

    def stop(self) -> bool:
        """Stop the server this state dir started; False when none runs."""
        with self._lock.acquire(timeout=60):
            record = self._read_pid()
            if record is None or not running(record):
                self._clear_state()
                return False
            # By pid and start time: the waiter reaps the server at once, so its pid may
            # already be another process's (never signalled).
            signal_process(record, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            while time.monotonic() < deadline and running(record):
                time.sleep(0.1)
            signal_process(record, signal.SIGKILL)
            self._clear_state()
            return True


class AttachedServer:
    """A server someone else runs (`KIMI_BATCH_LLAMA_URL`): health checks only, never spawned."""

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout_s: float = 60.0):
        self._url = base_url.rstrip("/")  # may hold credentials: only clients see it
        self.base_url = redact_url(base_url)
        self.api_key = api_key
        self.timeout_s = timeout_s

    def client(self, **kwargs: object) -> LlamaClient:
        return LlamaClient(self._url, api_key=self.api_key, **kwargs)  # type: ignore[arg-type]

    def ensure_running(self) -> ServerHandle:
        deadline = time.monotonic() + self.timeout_s
        while True:
            state, props = probe(self._url, self.api_key)
            if state == "ok" and props is not None:
                return ServerHandle(
                    base_url=self.base_url,
                    pid=None,
                    spawned=False,
                    slots=props.total_slots,
                    model=Path(props.model_path).name.removesuffix(".gguf") or "unknown",
                )
            if time.monotonic() > deadline:
                raise ServerSpawnError(f"no healthy llama-server at {self.base_url} ({state})")
            time.sleep(0.5)

    def status(self) -> ServerStatus:
        state, props = probe(self._url, self.api_key)
        return ServerStatus(
            running=state != "down",
            healthy=state == "ok",
            pid=None,
            base_url=self.base_url,
            model=Path(props.model_path).name.removesuffix(".gguf") if props else None,
            threads=None,
            slots=props.total_slots if props else None,
            managed=False,
            log_path=None,
        )

    def stop(self) -> bool:
        raise ServerSpawnError(f"{self.base_url} is attach-only: kimi_batch does not stop it")
