"""What a batch needs to know before its first request: the endpoints and the digest's tokens.

One call, one client session per endpoint, inside the caller's event loop, so a materialization
runs a single `asyncio.run` around preparing and generating.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.engine.batch_engine import Endpoint
from kimi_batch.engine.budget import SlotFit
from kimi_batch.engine.digest import SystemDigest
from kimi_batch.llama import LlamaClient, LlamaTimeoutError

# /props and /tokenize answer in milliseconds; the client retries each a few times within this.
PREPARE_TIMEOUT_S = 120.0


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

    def check_fit(
        self, *, prompt_tokens: int, answer_tokens: int, remedy: str | None = None
    ) -> list[SlotFit]:
        """Digest + prompt + answer against each endpoint's slot; raises
        `ContextTooSmallError` with the numbers for the first that cannot hold them."""
        fits = []
        for endpoint in self.endpoints:
            if not endpoint.ctx:
                continue  # the server does not say: the engine's cap is all there is
            fit = SlotFit(
                digest_tokens=self.digest_tokens,
                prompt_tokens=prompt_tokens,
                answer_tokens=answer_tokens,
                ctx=endpoint.ctx * endpoint.slots,
                slots=endpoint.slots,
            )
            fits.append(fit.check(remedy) if remedy is not None else fit.check())
        return fits


async def prepare(
    urls: Sequence[str],
    *,
    model: str,
    digest: SystemDigest,
    api_key: str | None = None,
    known_n_predict: int | None = None,
    slot_save_dir: Path | None = None,
    timeout_s: float = PREPARE_TIMEOUT_S,
) -> Prepared:
    """Ask each server for its slots and limits; count the digest with the first one's tokenizer.

    `known_n_predict` is the answer budget of a server whose /props reports none (llama.cpp's does
    not report `--n-predict`): the `-n` of the server kimi_batch started, or the configured
    default budget for an attached one, so no request goes out with an unbounded budget (the
    engine also caps it at the slot's context). Each server has `timeout_s` to answer: a frozen
    one accepts the connection and never does. `slot_save_dir` is the first server's
    --slot-save-path where this process can see it (the resident server's).
    """
    endpoints: list[Endpoint] = []
    digest_tokens = 0
    for index, url in enumerate(urls):
        async with LlamaClient(url, api_key=api_key) as client:
            try:
                async with asyncio.timeout(timeout_s):
                    props = await client.props()
                    if index == 0:
                        digest_tokens = len(await client.tokenize(digest.text))
            except TimeoutError:
                raise LlamaTimeoutError(
                    f"{client.base_url} did not describe itself within {timeout_s:.0f} s "
                    "(/props, /tokenize): it accepts connections but does not answer"
                ) from None
        n_predict = props.n_predict
        if n_predict <= 0 and known_n_predict is not None:
            n_predict = known_n_predict
        endpoints.append(
            Endpoint(
                base_url=url,
                slots=props.total_slots,
                model=model,
                ctx=props.n_ctx,
                n_predict=n_predict,
                api_key=api_key,
                slot_save_dir=slot_save_dir if index == 0 else None,
            )
        )
    return Prepared(endpoints=endpoints, digest_tokens=digest_tokens)
