"""The `kd` rows a trainer reads: ids, logprobs and top-k per completion position, the tokenizer
named, and the documented reader (docs/how-to/knowledge-distillation.md) run on an export."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest

from kimi_batch.cli.export import ExportRequest, run_export
from kimi_batch.errors import ConfigError
from kimi_batch.exports import ExportQuery, tokenizer_identity
from kimi_batch.llama import ChatCompletion, ChatMessage, ResidentServer
from kimi_batch.settings import Settings
from kimi_batch_tests.support.exports import KD_TOKENS, build_warehouse

DOC = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "knowledge-distillation.md"


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("KIMI_BATCH_HOME", str(tmp_path / "home"))
    return Settings.from_env()


def _reader() -> dict[str, Any]:
    """The doc's python block, run as it stands."""
    (block,) = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    namespace: dict[str, Any] = {}
    exec(compile(block, str(DOC), "exec"), namespace)
    return namespace


def _kd_rows(settings: Settings) -> list[dict[str, Any]]:
    build_warehouse(settings)
    query = ExportQuery(source="alpha")
    path = run_export(settings, ExportRequest(fmt="kd", query=query))
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_documented_reader_rebuilds_each_position_s_top_k_distribution(
    settings: Settings,
) -> None:
    rows = _kd_rows(settings)
    positions = _reader()["kd_positions"](rows[0])
    assert [p["position"] for p in positions] == [0, 1, 2]
    for position, token in zip(positions, KD_TOKENS, strict=True):
        assert (position["id"], position["token"], position["logprob"]) == (
            token.id,
            token.token,
            token.logprob,
        )
        assert position["top"] == {
            top.id: pytest.approx(math.exp(top.logprob)) for top in token.top
        }
        assert position["rest"] == pytest.approx(1 - sum(math.exp(t.logprob) for t in token.top))
    # Position 1's token was sampled outside its top-3: given, and not in the distribution.
    assert positions[1]["id"] not in positions[1]["top"]
    assert rows[0]["completion"] == "".join(token.token for token in KD_TOKENS)


def test_a_row_names_the_teacher_s_tokenizer_a_student_can_match(settings: Settings) -> None:
    assert settings.model is not None
    from gguf import GGUFReader

    rows = _kd_rows(settings)
    named = rows[0]["tokenizer"]
    expected = tokenizer_identity(settings.model)
    assert named == expected.model_dump()
    assert named["vocab_size"] == 49152
    assert named["model"] == "gpt2"
    tokens = GGUFReader(settings.model).fields["tokenizer.ggml.tokens"].contents()
    same = _reader()["same_vocabulary"]
    assert same(rows[0], tokens)
    assert not same(rows[0], [*tokens[:-1], "another"])


def test_a_model_file_too_small_for_the_ids_names_no_tokenizer(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kimi_batch.cli import export

    small = tokenizer_identity(settings.model or Path()).model_copy(update={"vocab_size": 1000})
    monkeypatch.setattr(export, "tokenizer_identity", lambda _model: small)
    assert [row["tokenizer"] for row in _kd_rows(settings)] == [None] * 6


def test_the_server_s_token_ids_are_kept_with_each_logprob() -> None:
    """llama-server writes `id` beside each token and alternative (OpenAI's shape plus ids)."""
    answer = ChatCompletion.model_validate(
        {
            "choices": [
                {
                    "message": {"content": "Hi"},
                    "logprobs": {
                        "content": [
                            {
                                "id": 11,
                                "token": "Hi",
                                "bytes": [72, 105],
                                "logprob": -0.5,
                                "top_logprobs": [
                                    {"id": 11, "token": "Hi", "bytes": [72, 105], "logprob": -0.5},
                                    {"id": 12, "token": "Hey", "logprob": -1.5},
                                ],
                            }
                        ]
                    },
                }
            ]
        }
    )
    (token,) = answer.logprobs or []
    assert token.id == 11
    assert [(top.id, top.token) for top in token.top] == [(11, "Hi"), (12, "Hey")]


@pytest.mark.slow
async def test_the_real_server_gives_each_token_s_id_in_the_served_vocabulary(
    shared_server: ResidentServer,
) -> None:
    """This build's chat logprobs carry `id` beside every token and alternative: the ids a
    `kd` row keeps, in the vocabulary its tokenizer names."""
    hello = [ChatMessage(role="user", content="Name a colour.")]
    async with shared_server.client() as client:
        answer = await client.chat(hello, max_tokens=8, temperature=0.0, top_logprobs=3)
        tokens = answer.logprobs or []
        assert tokens
        # Whole-word pieces tokenize back to the id the server gave them.
        words = [t for t in tokens if t.token.strip().isalpha()]
        assert words
        for token in words:
            assert await client.tokenize(token.token) == [token.id]
    vocabulary = tokenizer_identity(shared_server.spec.model).vocab_size
    ids = [t.id for t in tokens] + [top.id for t in tokens for top in t.top]
    assert all(i is not None and 0 <= i < vocabulary for i in ids)
    # At temperature 0 the generated token is the most likely one.
    assert all(t.top[0].id == t.id for t in tokens)


@pytest.mark.parametrize(
    "content",
    [b"not a model at all", b"GGUF" + bytes(3), os.urandom(4096)],
    ids=["text", "truncated", "random"],
)
def test_a_model_that_is_no_readable_gguf_is_one_config_error(
    tmp_path: Path, content: bytes
) -> None:
    """gguf raised ValueError or IndexError from deep inside (an export's traceback)."""
    model = tmp_path / "model.gguf"
    model.write_bytes(content)
    with pytest.raises(ConfigError, match=r"KIMI_BATCH_MODEL .*model\.gguf: not a GGUF file"):
        tokenizer_identity(model)
