"""Speculative decoding on the real llama-server: the flags reach the process, and every
generated row carries what the draft proposed and what was accepted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kimi_batch.engine import (
    BatchEngine,
    GenerationRequest,
    Ledger,
    SamplingParams,
    SystemDigest,
    prepare,
)
from kimi_batch.llama import ChatMessage
from kimi_batch.llama.server import ResidentServer
from kimi_batch.pipeline import generation_columns
from kimi_batch_tests.support.llama_server import make_spec

pytestmark = pytest.mark.slow

# The answer restates its input: what an n-gram draft can predict from the prompt.
COPY_PROMPT = "Repeat this list exactly, one item per line:\n" + "\n".join(
    f"- item {i}: the quick brown fox jumps over the lazy dog" for i in range(8)
)


def _process_argv(pid: int) -> list[bytes]:
    """The argv the running server process was started with (Linux)."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


@pytest.fixture
def spec_server(tmp_path: Path, llama_binary: Path, model_path: Path) -> Iterator[ResidentServer]:
    spec = make_spec(llama_binary, model_path, tmp_path, parallel=1, ctx=2048).model_copy(
        update={"spec_type": "ngram-simple"}
    )
    server = ResidentServer(spec, tmp_path / "server", load_timeout_s=300)
    handle = server.ensure_running()
    assert handle.pid is not None
    yield server
    server.stop()


async def test_drafted_and_accepted_tokens_are_provenance_columns(
    spec_server: ResidentServer, tmp_path: Path
) -> None:
    status = spec_server.status()
    assert status.pid is not None
    cmdline = _process_argv(status.pid)
    assert cmdline[cmdline.index(b"--spec-type") + 1] == b"ngram-simple"

    digest = SystemDigest.from_text("You copy text exactly when asked.")
    url = spec_server.spec.base_url
    prepared = await prepare([url], model="m", digest=digest)
    request = GenerationRequest(
        input_id="copy",
        messages=[ChatMessage(role="user", content=COPY_PROMPT)],
        params=SamplingParams(max_tokens=96, temperature=0.0),
    )
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        engine = BatchEngine(
            prepared.endpoints, digest, ledger, digest_tokens=prepared.digest_tokens
        )
        outcome = await engine.run([request])
        [result] = list(outcome.iter_results(ledger))

    columns = generation_columns(result)
    drafted, accepted = columns["draft_tokens"], columns["draft_accepted_tokens"]
    assert isinstance(drafted, int)
    assert isinstance(accepted, int)
    assert drafted > 0
    assert 0 <= accepted <= drafted
