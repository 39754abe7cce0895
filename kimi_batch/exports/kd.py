"""`--format kd`: one JSON line per answer with the teacher's tokens, their ids and top-k
alternatives, aligned to the completion's positions (docs/how-to/knowledge-distillation.md).

    {<the answer's chat row: "messages": [...]>, "request_id", "model", "top_k",
     "completion": the token texts joined,
     "tokenizer": {"gguf_file", "name", "vocab_size", "vocab_sha256", ...} or null,
     "logprobs": {"content": [{"id", "token", "logprob", "top_logprobs": [{"id", "token",
                                                                          "logprob"}]}]}}

`logprobs.content[i]` is completion position i: the i-th token the teacher generated (its
reasoning first when the server split one off, then the answer), in OpenAI's shape plus
llama-server's `id`. The ids are the teacher's vocabulary's, named by `tokenizer`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from kimi_batch.exports.tokenizer import TokenizerIdentity
from kimi_batch.llama import TokenLogprob, TopLogprob


def _alternative(top: TopLogprob) -> dict[str, Any]:
    return {"id": top.id, "token": top.token, "logprob": top.logprob}


def _position(token: TokenLogprob) -> dict[str, Any]:
    return {
        "id": token.id,
        "token": token.token,
        "logprob": token.logprob,
        "top_logprobs": [_alternative(top) for top in token.top],
    }


def kd_record(
    *,
    chat: Mapping[str, Any],
    request_id: str,
    model: str,
    logprobs: Sequence[TokenLogprob],
    tokenizer: TokenizerIdentity | None,
) -> dict[str, Any]:
    """One answer's `kd` row: its `chat` row (what `--format chat` writes for it) and the
    fields the module docstring draws."""
    return {
        **chat,
        "request_id": request_id,
        "model": model,
        "top_k": max((len(token.top) for token in logprobs), default=0),
        "completion": "".join(token.token for token in logprobs),
        "tokenizer": tokenizer.model_dump() if tokenizer is not None else None,
        "logprobs": {"content": [_position(token) for token in logprobs]},
    }


def kd_line(**record: Any) -> str:
    """`kd_record(**record)` as one JSON line."""
    return json.dumps(kd_record(**record), ensure_ascii=False, separators=(",", ":"))
