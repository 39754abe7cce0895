"""What a batch needs to know before its first request: the endpoints and the digest's tokens.

One call, one client session per endpoint, inside the caller's event loop, so a materialization
runs a single `asyncio.run` around preparing and generating.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.engine.digest import SystemDigest
from kimi_batch.engine.runner import Endpoint
from kimi_batch.llama import LlamaClient

__all__ = ["Prepared", "prepare"]


class Prepared(BaseModel):
    """The endpoints of a batch (slots, context, n_predict) and the digest's token count."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoints: list[Endpoint] = Field(min_length=1)
    digest_tokens: int = Field(ge=0)

    @property
    def slot_ctx(self) -> int:
        """Context of one slot of the first endpoint (what a prompt must fit in)."""
        first = self.endpoints[0]
        return first.ctx or 0


async def prepare(
    urls: Sequence[str],
    *,
    model: str,
    digest: SystemDigest,
    api_key: str | None = None,
    known_n_predict: int | None = None,
) -> Prepared:
    """Ask each server for its slots and limits; count the digest with the first one's tokenizer.

    `known_n_predict` covers llama.cpp's /props, which does not report `--n-predict`: for the
    server kimi_batch started, the caller knows it.
    """
    endpoints: list[Endpoint] = []
    digest_tokens = 0
    for index, url in enumerate(urls):
        async with LlamaClient(url, api_key=api_key) as client:
            props = await client.props()
            if index == 0:
                digest_tokens = len(await client.tokenize(digest.text))
        n_predict = props.n_predict
        if n_predict <= 0 and index == 0 and known_n_predict is not None:
            n_predict = known_n_predict
        endpoints.append(
            Endpoint(
                base_url=url,
                slots=props.total_slots,
                model=model,
                ctx=props.n_ctx,
                n_predict=n_predict,
                api_key=api_key,
            )
        )
    return Prepared(endpoints=endpoints, digest_tokens=digest_tokens)
