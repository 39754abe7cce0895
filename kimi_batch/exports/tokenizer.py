"""Which tokenizer a `kd` export's token ids belong to: the teacher GGUF's name and hashes of
its vocabulary, read with the `gguf` package (llama.cpp's own reader of the format).

A student whose tokenizer has the same `vocab_sha256` (the id -> token text map) can use the
teacher's ids directly; any other must map the token texts onto its own vocabulary.
llama-server's `/props` names the model file but not its vocabulary, so the file is read here.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.errors import ConfigError


class TokenizerIdentity(BaseModel):
    """The teacher's tokenizer as a `kd` row names it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gguf_file: str = Field(description="The GGUF file's name the ids were read against.")
    name: str | None = Field(description="`general.name` of the GGUF.")
    model: str | None = Field(description="`tokenizer.ggml.model` (gpt2, llama, ...).")
    pre: str | None = Field(description="`tokenizer.ggml.pre`: the pre-tokenizer's name.")
    vocab_size: int = Field(ge=0)
    vocab_sha256: str = Field(description="sha256 of the token texts in id order (JSON list).")
    merges_sha256: str | None = Field(description="sha256 of the BPE merges (JSON list).")


def _contents(fields: Any, key: str) -> Any:
    field = fields.get(key)
    return None if field is None else field.contents()


def _sha(values: list[str]) -> str:
    text = json.dumps(values, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def tokenizer_identity(model: Path) -> TokenizerIdentity:
    """The identity of `model`'s tokenizer (memory-mapped: the weights are never read)."""
    from gguf import GGUFReader  # numpy-heavy: imported only by an export that asks

    try:
        fields = GGUFReader(model).fields
    except (ValueError, IndexError, OSError) as error:  # gguf's errors for a file it cannot map
        raise ConfigError(
            f"KIMI_BATCH_MODEL {model}: not a GGUF file whose tokenizer can be read ({error})"
        ) from error
    tokens = [str(token) for token in _contents(fields, "tokenizer.ggml.tokens") or []]
    merges = _contents(fields, "tokenizer.ggml.merges")
    return TokenizerIdentity(
        gguf_file=model.name,
        name=_contents(fields, "general.name"),
        model=_contents(fields, "tokenizer.ggml.model"),
        pre=_contents(fields, "tokenizer.ggml.pre"),
        vocab_size=len(tokens),
        vocab_sha256=_sha(tokens),
        merges_sha256=_sha([str(m) for m in merges]) if merges else None,
    )
