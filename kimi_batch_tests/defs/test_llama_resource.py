"""`LlamaServerResource` in a real Dagster run: a server killed by a signal is named in the run log.

The crash at start is a stand-in binary (a real llama-server cannot be made to segfault in its
model load on demand); the death later is the real llama-server, killed with SIGSEGV.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from kimi_batch.definitions import DIGEST_ASSETS, build_resources
from kimi_batch.defs.resources import LlamaServerResource
from kimi_batch.engine import BatchEngine, GenerationRequest, Ledger, SamplingParams
from kimi_batch.llama import ChatMessage
from kimi_batch.settings import Settings
from kimi_batch_tests.support.crashing_binary import crashing_binary
from kimi_batch_tests.support.engine import fresh_digest
from kimi_batch_tests.support.llama_server import TEST_CTX, TEST_SLOTS, LlamaEnv
from kimi_batch_tests.support.ports import free_port

pytestmark = pytest.mark.slow  # a server, or a stand-in binary, runs as a child


@pytest.fixture
def state_env(tmp_path: Path, model_path: Path) -> Iterator[pytest.MonkeyPatch]:
    """A fresh state dir and port for this test's own server (never the session's)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
        patch.setenv("KIMI_BATCH_MODEL", str(model_path))
        patch.setenv("KIMI_BATCH_LLAMA_PORT", str(free_port()))
        patch.setenv("KIMI_BATCH_LLAMA_THREADS", "1")
        patch.setenv("KIMI_BATCH_LLAMA_CTX", "4096")
        patch.setenv("KIMI_BATCH_LLAMA_PARALLEL", "2")
        patch.setenv("KIMI_BATCH_LLAMA_N_PREDICT", "256")  # digest + question + answer fit a slot
        for name in ("KIMI_BATCH_LLAMA_URL", "KIMI_BATCH_TRINO_HOST", "DAGSTER_HOME"):
            patch.delenv(name, raising=False)
        yield patch
        LlamaServerResource(deployment=Settings.from_env()).server().manager().stop()


def _run_log(instance: dg.DagsterInstance, run_id: str) -> str:
    """Every message of the run's event log, with the errors its step failures carry."""
    lines = []
    for entry in instance.all_logs(run_id):
        lines.append(entry.user_message)
        event = entry.dagster_event
        if event is not None and event.is_step_failure:
            error = event.step_failure_data.error
            while error is not None:
                lines.append(error.message)
                error = error.cause
    return "\n".join(lines)


def test_a_server_killed_by_sigsegv_at_start_fails_the_run_naming_the_signal(
    state_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    state_env.setenv("KIMI_BATCH_LLAMA_SERVER", str(crashing_binary(tmp_path, "SEGV")))
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            DIGEST_ASSETS,
            resources=build_resources(Settings.from_env()),
            instance=instance,
            raise_on_error=False,
        )
        log = _run_log(instance, result.run_id)
    assert not result.success
    (failure,) = result.get_step_failure_events()  # the first step that needs the server
    error = failure.step_failure_data.error
    assert error is not None
    assert error.cause is not None
    assert error.cause.cls_name == "ServerKilledError"
    expected = "was killed by SIGSEGV during the model load / first computation"
    assert expected in error.cause.message
    assert str(tmp_path / "home" / "server" / "server.log") in error.cause.message
    assert expected in log


def test_a_server_that_died_by_a_signal_is_named_in_the_run_that_starts_it_again(
    state_env: pytest.MonkeyPatch, llama_binary: Path
) -> None:
    state_env.setenv("KIMI_BATCH_LLAMA_SERVER", str(llama_binary))
    first = LlamaServerResource(deployment=Settings.from_env()).server().ensure_running()
    assert first.pid is not None
    os.kill(first.pid, signal.SIGSEGV)
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            DIGEST_ASSETS, resources=build_resources(Settings.from_env()), instance=instance
        )
        log = _run_log(instance, result.run_id)
    assert result.success
    assert f"llama-server (pid {first.pid}) was killed by SIGSEGV after" in log
    assert "it was started again" in log


async def test_an_attached_server_gets_the_default_budget_capped_at_its_slot(
    llama_env: LlamaEnv,
) -> None:
    # Attach-only (KIMI_BATCH_LLAMA_URL): /props is all that is known of the server. A request
    # without max_tokens (the Batch API's "as long as the server allows") must not go out
    # unbounded: the default budget, at most what the slot holds after the digest.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KIMI_BATCH_LLAMA_URL", llama_env.base_url)
        patch.setenv("KIMI_BATCH_LLAMA_N_PREDICT", "100")
        resource = LlamaServerResource(deployment=Settings.from_env())
        digest = fresh_digest("attached")
        prepared = await resource.server().prepare(digest)
    (endpoint,) = prepared.endpoints
    assert endpoint.ctx == TEST_CTX // TEST_SLOTS  # per slot, from /props
    # llama.cpp's /props reports no n_predict (-1) whatever the server's -n: the default budget.
    assert endpoint.n_predict == 100
    request = GenerationRequest(
        input_id="line-1",
        messages=[ChatMessage(role="user", content="Say hello.")],
        params=SamplingParams(max_tokens=1 << 20),
    )
    with Ledger(llama_env.home / "attached-ledger.sqlite3") as ledger:
        engine = BatchEngine(
            prepared.endpoints, digest, ledger, digest_tokens=prepared.digest_tokens
        )
        (planned,) = engine.plan([request])
    assert planned.params.max_tokens == endpoint.n_predict
    assert planned.params.max_tokens <= TEST_CTX // TEST_SLOTS - prepared.digest_tokens
