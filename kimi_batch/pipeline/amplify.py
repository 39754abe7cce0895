"""Amplification: k new prompts per seed per strategy, parsed, checked and deduplicated.

The instruction templates are user-side text (the digest holds the long rules for each strategy),
worded so that a 135M model still answers with a bare question and a large model does not add
commentary. The seed comes first and the instruction after it, so the requests of one seed share
a long prefix (see `variant_instruction`). Each of the k requests of a seed gets its own sampling seed and its own variant
number in the text, so the k requests have different content hashes (different ledger keys and
different samples even under greedy decoding) and the same ones on every rerun.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import ClassVar

from pydantic import Field

from kimi_batch.engine import GenerationRequest, GenerationResult, SamplingParams
from kimi_batch.inputs import SeedPrompt
from kimi_batch.llama import ChatMessage
from kimi_batch.pipeline.generation_task import (
    AMPLIFY_STAGE,
    GenerationTask,
    RequestTag,
    RowReader,
    SeedInputs,
    SetAside,
    Strategy,
    generation_columns,
)
from kimi_batch.pipeline.rows import AmplifiedRow, GenerationColumns
from kimi_batch.quality import loose_text, normalize_text

# Short sentences, one task, "only the new question" said twice in different words: small models
# follow the last instruction they read, large ones otherwise like to explain what they changed.
TEMPLATES: dict[Strategy, str] = {
    Strategy.PARAPHRASE: (
        "Rewrite the question above using different words and a different sentence structure. "
        "Keep exactly the same meaning, so that it has the same answer. "
        "Do not answer it. Reply with the rewritten question only."
    ),
    Strategy.HARDER: (
        "Write a harder version of the question above. Stay on the same topic, but make it need "
        "more steps, more knowledge or more careful reasoning. It must still be clear and have "
        "one good answer. Do not answer it. Reply with the new question only."
    ),
    Strategy.RELATED: (
        "Write a new question on the same topic as the question above. It must ask about "
        "something different, not the same thing in other words, and make sense on its own. "
        "Do not answer it. Reply with the new question only."
    ),
}

# Variants are short; a higher temperature than for answers spreads the k samples apart.
DEFAULT_AMPLIFY_PARAMS = SamplingParams(max_tokens=128, temperature=0.9, top_p=0.95)

_MIN_VARIANT_CHARS = 8
# Straight, curly (U+2018/9, U+201C/D), low-9 and guillemet quotes.
_QUOTES = "\"'`\u201c\u201d\u2018\u2019\u00ab\u00bb\u201e"
# What may end (or open) a sentence without changing the question: ".", "?", "!", "…", "¿", "¡"
# and their CJK and fullwidth forms, and quotes.
_SENTENCE_ENDS = _QUOTES + ".?!\u2026\u00bf\u00a1\u3002\uff0e\uff1f\uff01 "
# "Paraphrase:", "**Rewritten question:**", "Variant 2 of 3 - ", "New harder question:" ... A
# dash counts only with spaces around it, so "Question-answering systems: ..." stays whole.
# Anchored with ^ (tried at the start only) and each whitespace run in it bounded by a word or a
# mark, so a long run of whitespace costs it linear time (test_answer_parsing_properties.py).
_LABEL = re.compile(
    r"^\W{0,4}(?:[a-z]+\s+){0,4}"
    r"(?:question|paraphrase|variant|version|rewrite|rephrasing|prompt)"
    r"(?:\s*#?\d+(?:\s*(?:of|/)\s*\d+)?)?(?:\*\*)?\s*(?::|\s[-\u2013\u2014]\s)\s*(?:\*\*)?\s*",
    re.IGNORECASE,
)
# The variant number of the instruction, echoed back by a small model.
_ECHOED_NUMBER = re.compile(r"\(?this is variant \d+ of \d+\.?\)?\s*", re.IGNORECASE)
# A lead-in line such as "Sure! Here is a harder version:" or "Here's the rewritten question:".
_LEAD_IN = re.compile(r"^(?:sure|certainly|okay|ok|of course|here)\b.*:\s*$", re.IGNORECASE)
_LIST_MARK = re.compile(r"^(?:[-*•]\s+|\d+[.)]\s+)")
_FENCE = "```"
# A fence's language tag ("```text", "```markdown"): the word on the opening line.
_FENCE_TAG = re.compile(r"[\w-]*")
# The line breaks of str.splitlines, as the paragraphs and lines of an answer are read.
_LINE_BREAK = re.compile(r"[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]")


def variant_instruction(strategy: Strategy, prompt: str, *, index: int, k: int) -> str:
    """The user message asking for variant `index` (0-based) of `k` of `prompt`.

    What requests share comes first: the seed (shared by all its strategies and variants), then
    the strategy's instruction (shared by its k variants), then the variant number. Requests of
    one seed run back to back on one slot, so each evaluates only what follows the shared part.
    """
    numbering = f" This is variant {index + 1} of {k}." if k > 1 else ""
    return f"Question:\n{prompt.strip()}\n\n{TEMPLATES[strategy]}{numbering}"


def _variant_seed(base: int | None, seed_id: str, strategy: Strategy, index: int) -> int:
    key = f"{base}|{seed_id}|{strategy.value}|{index}".encode()
    # 31 bits: llama.cpp takes the seed as a uint32 and reserves 0xFFFFFFFF for "random".
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "big") & 0x7FFFFFFF


def amplification_requests(
    seeds: Sequence[SeedPrompt],
    strategies: Iterable[Strategy | str],
    k: int,
    params: SamplingParams = DEFAULT_AMPLIFY_PARAMS,
) -> list[GenerationRequest]:
    """k requests per seed per strategy (tag = strategy), deterministic across reruns.

    Row-level overrides of a seed are for its answer, so they do not apply here; a multi-turn
    seed is amplified from its last user message.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    unique = list(dict.fromkeys(Strategy(strategy) for strategy in strategies))
    requests: list[GenerationRequest] = []
    for seed in seeds:
        for strategy in unique:
            for index in range(k):
                text = variant_instruction(strategy, seed.prompt, index=index, k=k)
                variant_params = params.model_copy(
                    update={"seed": _variant_seed(params.seed, seed.input_id, strategy, index)}
                )
                requests.append(
                    GenerationRequest(
                        input_id=seed.input_id,
                        messages=[ChatMessage(role="user", content=text)],
                        params=variant_params,
                        tag=RequestTag(stage=AMPLIFY_STAGE, strategy=strategy).wire,
                    )
                )
    return requests


def _unfenced(text: str) -> str:
    """`text` stripped, without a Markdown fence mark where it starts (with its language tag)
    and where it ends.

    String operations, not the regex ^```[\\w-]*\\s*|\\s*```$: its \\s*```$ was tried at
    every position of a run of whitespace, quadratic (40,000 spaces: 2.6 s a pass, and the parse
    runs it on the whole text and on each paragraph). And a language tag is a word alone on the
    opening line: [\\w-]* took the first word of a one-line fence ("```Rewrite the poem```")
    for one."""
    text = text.strip()
    if text.startswith(_FENCE):
        text = text[len(_FENCE) :]
        line_end = _LINE_BREAK.search(text)
        if line_end is not None and _FENCE_TAG.fullmatch(text[: line_end.start()].rstrip()):
            text = text[line_end.start() :]
        text = text.lstrip()
    if text.endswith(_FENCE):
        text = text[: -len(_FENCE)].rstrip()
    return text


def _strip_decorations(paragraph: str) -> str:
    # A fence of its own: the answer's fence is stripped from the whole text only where it
    # opens and closes it, not where a lead-in precedes it or an explanation follows it.
    text = _unfenced(paragraph)
    if _LIST_MARK.match(text):
        # A numbered list of alternatives: the first item is the variant.
        text = text.splitlines()[0]
    for _ in range(3):  # labels, list marks, bold and quotes can nest: "1. **Question:** "x""
        before = text
        text = _LIST_MARK.sub("", _LABEL.sub("", text, count=1), count=1).strip()
        text = text.strip("*_").strip()
        if len(text) >= 2 and text[0] in _QUOTES and text[-1] in _QUOTES:
            text = text[1:-1].strip()
        if text == before:
            break
    return text


def _parse(result: GenerationResult) -> tuple[str | None, str]:
    """The variant, or None and why not."""
    text = _ECHOED_NUMBER.sub("", _unfenced(result.text)).strip()
    lines = text.splitlines()
    while lines and (not lines[0].strip() or _LEAD_IN.match(lines[0].strip())):
        lines.pop(0)
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", "\n".join(lines)) if p.strip()]
    candidates = [(i, _strip_decorations(p)) for i, p in enumerate(paragraphs)]
    candidates = [(i, c) for i, c in candidates if c]
    if not candidates:
        return None, "empty output"
    index, variant = candidates[0]
    if index == len(paragraphs) - 1 and result.finish_reason == "length":
        return None, "variant cut off at max_tokens (finish_reason=length)"
    if len(variant) < _MIN_VARIANT_CHARS or not any(ch.isalpha() for ch in variant):
        return None, f"output too short to be a prompt: {variant!r}"
    # Loose: an echo of the instruction is one whatever its punctuation.
    normalized = loose_text(variant)
    for template in TEMPLATES.values():
        # Small models sometimes repeat the instruction instead of following it.
        if normalized.startswith(loose_text(template)[:40]):
            return None, "output repeats the instruction"
    return variant, ""


def parse_variant(result: GenerationResult) -> str | None:
    """The new prompt in a completion (labels, quotes, lead-ins stripped), or None if unusable."""
    return _parse(result)[0]


def _variant_key(prompt: str) -> str:
    """The exact key, less quotes and sentence marks at its ends: a variant that only drops the
    seed's question mark or quotes itself is no new prompt. Not a looser key: a "harder" or
    "related" variant of "What is 2+2?" may well be "What is 2*2?", a new prompt."""
    return normalize_text(prompt).strip(_SENTENCE_ENDS).strip()


def _new_variants(
    rows: Iterable[AmplifiedRow], seed_prompts: Iterable[str]
) -> Iterator[AmplifiedRow]:
    seen = {_variant_key(prompt) for prompt in seed_prompts}
    for row in rows:
        key = _variant_key(row.prompt)
        if key not in seen:
            seen.add(key)
            yield row


def dedup_variants(
    rows: Sequence[AmplifiedRow], seed_prompts: Mapping[str, str]
) -> tuple[list[AmplifiedRow], int]:
    """Drop variants whose normalized text equals a seed prompt or an earlier variant.

    Returns the kept rows (input order) and the number dropped.
    """
    kept = list(_new_variants(rows, seed_prompts.values()))
    return kept, len(rows) - len(kept)


class AmplifyTask(GenerationTask[SeedInputs, AmplifiedRow]):
    """k variants per seed per strategy (table `amplified`), deduplicated against the seeds."""

    name: ClassVar[str] = AMPLIFY_STAGE
    table: ClassVar[str] = "amplified"
    row_model: ClassVar[type[GenerationColumns]] = AmplifiedRow
    dropped_metric: ClassVar[str | None] = "duplicates_dropped"

    strategies: list[Strategy] = Field(default_factory=lambda: list(Strategy))
    k: int = Field(default=1, ge=1, description="Variants per seed and strategy.")
    params: SamplingParams = DEFAULT_AMPLIFY_PARAMS

    def load(self, read: RowReader) -> SeedInputs:
        return SeedInputs.read(read)

    def requests(self, inputs: SeedInputs) -> list[GenerationRequest]:
        return amplification_requests(inputs.seeds, self.strategies, self.k, self.params)

    def order(self, results: Iterable[GenerationResult]) -> list[GenerationResult]:
        """By (seed, strategy, request id): which duplicate survives does not depend on the
        order in which the server finished them."""
        return sorted(results, key=lambda r: (r.input_id, r.tag, r.request_id))

    def parse(self, result: GenerationResult, inputs: SeedInputs) -> AmplifiedRow | SetAside:
        seed = inputs.seed_of(result)
        try:
            tag = RequestTag.parse(result.tag)
        except ValueError:
            tag = None
        if tag is None or tag.stage != AMPLIFY_STAGE or tag.strategy is None:
            raise ValueError(f"result {result.request_id} has no strategy tag: {result.tag!r}")
        variant, reason = _parse(result)
        if variant is None:
            return SetAside(reason=reason, source_file=seed.source_file, line=seed.line)
        return AmplifiedRow.model_validate(
            {
                **generation_columns(result),
                "seed_id": seed.input_id,
                "strategy": tag.strategy.value,
                "prompt": variant,
            }
        )

    def keep(self, rows: Iterable[AmplifiedRow], inputs: SeedInputs) -> Iterator[AmplifiedRow]:
        """Without variants equal to a seed prompt or an earlier variant (normalized text)."""
        return _new_variants(rows, (seed.prompt for seed in inputs.seeds))
