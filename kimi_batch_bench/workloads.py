"""The prompts every contender of `kimi-batch bench` sends: written as an inbox file, read back.

Going through a real inbox file makes the engine's, the clients' and the Dagster run's requests
the same objects (`read_inbox_file` -> the tasks' request builders), down to the sampling seed.
Distillation prompts are HumanEval-style function specs; amplification seeds are real functions of
Python's standard library with a question about them (150-400 tokens each), so the variants of a
seed share a long prefix the way real seeds with context do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.engine import GenerationRequest, SamplingParams, estimate_tokens
from kimi_batch.inputs import SeedPrompt, read_inbox_file
from kimi_batch.llama import ChatMessage
from kimi_batch.pipeline import (
    Strategy,
    amplification_requests,
    distillation_requests,
    judge_prompt,
)

__all__ = [
    "Workload",
    "WorkloadName",
    "amplify_workload",
    "distill_workload",
    "judge_workload",
    "rewrite_workload",
    "write_inbox_file",
]

WorkloadName = Literal[
    "distill", "amplify", "judge", "rewrite", "night", "rehearsal", "api-prompts"
]

# (function, what it does): 24 specs, one answer each.
FUNCTION_SPECS: tuple[tuple[str, str], ...] = (
    ("has_close_elements(numbers, threshold)", "any two numbers are closer than threshold"),
    ("separate_paren_groups(text)", "split balanced groups of parentheses into a list"),
    ("truncate_number(x)", "the decimal part of a positive float"),
    ("below_zero(operations)", "whether a bank balance starting at zero ever drops below zero"),
    ("mean_absolute_deviation(numbers)", "the mean absolute deviation around the mean"),
    ("intersperse(numbers, delimiter)", "insert delimiter between consecutive elements"),
    ("parse_nested_parens(text)", "the deepest nesting level of each group of parentheses"),
    ("filter_by_substring(strings, sub)", "the strings that contain sub"),
    ("sum_product(numbers)", "a tuple of the sum and the product of a list"),
    ("rolling_max(numbers)", "the running maximum of a list"),
    ("make_palindrome(text)", "the shortest palindrome that begins with text"),
    ("string_xor(a, b)", "bitwise XOR of two strings of 0s and 1s"),
    ("longest(strings)", "the longest string, the first one on ties, None for an empty list"),
    ("greatest_common_divisor(a, b)", "the greatest common divisor of two integers"),
    ("all_prefixes(text)", "all prefixes of a string from shortest to longest"),
    ("string_sequence(n)", "the numbers 0 to n joined by spaces"),
    ("count_distinct_characters(text)", "how many distinct characters, ignoring case"),
    ("parse_music(notes)", "beats per note of a string in a simple ASCII music format"),
    ("how_many_times(text, sub)", "occurrences of sub in text, overlapping ones included"),
    ("sort_numbers(words)", "number words from 'zero' to 'nine' sorted by value"),
    ("find_closest_elements(numbers)", "the two closest numbers of a list, in order"),
    ("rescale_to_unit(numbers)", "a linear map of the list so that its min is 0 and max is 1"),
    ("largest_divisor(n)", "the largest number below n that divides n"),
    ("remove_duplicates(numbers)", "the elements that occur once, in their original order"),
)


# Pure-Python functions of the standard library (C or frozen ones have no source to show).
_CANDIDATES: tuple[tuple[str, str], ...] = (
    ("textwrap", "dedent"),
    ("difflib", "get_close_matches"),
    ("statistics", "median_grouped"),
    ("urllib.parse", "urljoin"),
    ("statistics", "mode"),
    ("ipaddress", "ip_address"),
    ("textwrap", "indent"),
    ("colorsys", "rgb_to_hls"),
    ("fnmatch", "filter"),
    ("shutil", "which"),
    ("shutil", "copyfileobj"),
    ("heapq", "merge"),
    ("calendar", "monthrange"),
    ("glob", "glob"),
    ("json", "dumps"),
    ("string", "capwords"),
    ("fractions", "Fraction.limit_denominator"),
    ("os", "makedirs"),
)
# 150-400 tokens at ~3.5 characters per token of code, with the question around it.
_SEED_CHARS = (450, 1200)


def _stdlib_sources() -> list[tuple[str, str]]:
    """(qualified name, source) of the candidates whose source is long enough here."""
    import importlib
    import inspect

    found: list[tuple[str, str]] = []
    for module_name, attr in _CANDIDATES:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
        try:
            source = inspect.getsource(target)
        except (OSError, TypeError):
            continue
        if len(source) >= _SEED_CHARS[0]:
            found.append((f"{module_name}.{attr}", source[: _SEED_CHARS[1]].rstrip()))
    return found


def _seed_text(name: str, source: str) -> str:
    return (
        f"Here is `{name}` from Python's standard library:\n\n```python\n{source}\n```\n\n"
        "What does it return for an empty or unusual input, and why?"
    )


class Workload(BaseModel):
    """One workload: its seeds (as read from the inbox file) and the requests built from them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: WorkloadName
    seeds: list[SeedPrompt]
    requests: list[GenerationRequest]
    output_tokens: int = Field(gt=0)
    params: SamplingParams


def write_inbox_file(path: Path, prompts: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for index, prompt in enumerate(prompts):
            out.write(json.dumps({"id": f"bench-{index:03d}", "prompt": prompt}) + "\n")
    return path


def _params(output_tokens: int) -> SamplingParams:
    # Fixed lengths come from the bench server's --ignore-eos; max_tokens is the length.
    return SamplingParams(max_tokens=output_tokens, temperature=0.7, top_p=0.95, seed=11)


def distill_workload(inbox_file: Path, *, rows: int, output_tokens: int) -> Workload:
    """`rows` HumanEval-style prompts (cycling through the specs for more than 24)."""
    prompts = [
        f"Write a Python function `{signature}` that returns {task}. "
        f"Include a docstring and two doctest examples. (task {index + 1})"
        for index, (signature, task) in (
            (i, FUNCTION_SPECS[i % len(FUNCTION_SPECS)]) for i in range(rows)
        )
    ]
    seeds = read_inbox_file(write_inbox_file(inbox_file, prompts)).seeds
    params = _params(output_tokens)
    return Workload(
        name="distill",
        seeds=seeds,
        requests=distillation_requests(seeds, [], params),
        output_tokens=output_tokens,
        params=params,
    )


# A plausible teacher answer to a function spec, repeated to the answer length the night writes.
_ANSWER = (
    'def solve(values):\n    """Return the result for values.\n\n    >>> solve([1, 2])\n'
    '    3\n    """\n    total = 0\n    for value in values:\n        total += value\n'
    "    return total\n"
)
# A verdict: {"score": 7, "reason": "<one sentence>"}.
JUDGE_VERDICT_TOKENS = 48


def judge_workload(distill: Workload, *, rubric: str, answer_tokens: int) -> Workload:
    """The judge stage over the distill workload's prompts, each with an answer of about
    `answer_tokens` tokens: the rubric, the request and the answer read, a verdict written."""
    repeats = max(1, round(answer_tokens / max(estimate_tokens(_ANSWER), 1)))
    answer = (_ANSWER * repeats).rstrip()
    params = _params(JUDGE_VERDICT_TOKENS)
    requests = [
        GenerationRequest(
            input_id=seed.input_id,
            messages=[ChatMessage(role="user", content=judge_prompt(rubric, seed.prompt, answer))],
            params=params,
            tag="judge",
        )
        for seed in distill.seeds
    ]
    return Workload(
        name="judge",
        seeds=distill.seeds,
        requests=requests,
        output_tokens=JUDGE_VERDICT_TOKENS,
        params=params,
    )


def amplify_workload(
    inbox_file: Path, *, seeds: int, variants: int, output_tokens: int
) -> Workload:
    """`seeds` stdlib-function seeds x 3 strategies x `variants` variants each."""
    sources = _stdlib_sources()
    texts = [_seed_text(*sources[i % len(sources)]) for i in range(seeds)]
    if seeds > len(sources):  # more seeds than functions: keep them distinct
        texts = [f"{text} (seed {i + 1})" for i, text in enumerate(texts)]
    batch = read_inbox_file(write_inbox_file(inbox_file, texts)).seeds
    params = _params(output_tokens)
    return Workload(
        name="amplify",
        seeds=batch,
        requests=amplification_requests(batch, list(Strategy), variants, params),
        output_tokens=output_tokens,
        params=params,
    )


# Copy-heavy edits: most of each answer restates its input, which an n-gram draft can predict.
_PARAGRAPHS: tuple[str, ...] = (
    "their is three reason why the cache brake when the system prompt change, first the bytes "
    "is different, second the prefix dont match and third the server have to prefill again",
    "the nightly job run at two oclock and it stop when the window close, rows that was not "
    "done gets picked up by the next night without nobody touching nothing",
    "a slot that loose the digest must be warm again before it take new requests, otherwise "
    "every request pay for the hole prefill wich take fourty minute on the target",
)
_RECORDS: tuple[str, ...] = (
    "name: SmolLM2\nparameters: 135M\nquantization: Q4_1\ncontext: 8192\nlicense: Apache-2.0",
    "host: 127.0.0.1\nport: 8081\nthreads: 13\nslots: 4\nubatch: 256\ncache_ram: 32768",
    "date: 2026-01-15\nsource: support_tickets\nrows: 1200\nlanguage: en\nstatus: landed",
)


def _rewrite_prompts(rows: int) -> list[str]:
    hints = [
        "Add type hints to every parameter and return value of this function. Answer with the "
        f"whole function and nothing else.\n\n```python\n{source}\n```"
        for _, source in _stdlib_sources()
    ]
    grammar = [
        f"Fix the grammar and spelling of this text. Answer with the corrected text only.\n\n{text}"
        for text in _PARAGRAPHS
    ]
    to_json = [
        f"Convert these fields to one JSON object. Answer with the JSON only.\n\n{text}"
        for text in _RECORDS
    ]
    kinds = (hints, grammar, to_json)  # interleaved: any prefix of the rows has all three
    return [f"{kinds[i % 3][(i // 3) % len(kinds[i % 3])]}\n(item {i + 1})" for i in range(rows)]


def rewrite_workload(inbox_file: Path, *, rows: int, output_tokens: int) -> Workload:
    """`rows` copy-heavy edits (type hints, grammar, JSON), greedy: the speculation workload."""
    seeds = read_inbox_file(write_inbox_file(inbox_file, _rewrite_prompts(rows))).seeds
    params = SamplingParams(max_tokens=output_tokens, temperature=0.0, top_p=1.0, seed=11)
    return Workload(
        name="rewrite",
        seeds=seeds,
        requests=distillation_requests(seeds, [], params),
        output_tokens=output_tokens,
        params=params,
    )
