"""The duplicate index, and the texts duplicates and benchmark overlap are judged on: the exact
key (`normalize_text`), the loose text (`loose_text`) and the tokens n-grams and shingles are made
of (`text_tokens`).

The index holds every kept row of the gated stages, across every night and every worker.
One state store (`StatePaths.dedup_state`): a SQLite file in the state dir, or a schema of the
PostgreSQL database that several workers share, so a row is screened against what any of them
kept. Per kept row (`kept`): its partition and ids, its exact key (the first 16 bytes
of the sha256 of its normalized text) and its MinHash signature (datasketch, 128 permutations
over word shingles). Per LSH band of each signature (`bands`): the band's 64-bit hash and the kept
row, the table's primary key. A row is checked with indexed lookups only (its exact key, then its
band hashes, then the few candidates' signatures, whose estimated Jaccard similarity must reach
the threshold), so screening a partition costs the same whatever the history holds: nothing is
loaded into memory. datasketch chooses the bands (`MinHashLSH`'s optimum for the threshold).

A partition is screened inside one write transaction (`DedupIndex.partition`), begun at its first
row (so a stage that generates again before its first row never holds the index) or at its end:
its own earlier entries are dropped first (a rebuilt partition replaces them, and a rerun never
finds its own rows), each row is checked against every other partition's entries and the rows it
kept before it, and the kept rows are inserted as they go. The block's end commits them; an
error rolls everything back, so a run that dies mid-way leaves the index as it was. Two
partitions landing at once are serialized by the transaction.

The signature setting (library scheme, permutations, shingle size, fields, bands) is stored in the
index: under another one the signatures cannot be compared, and the first partition screened
rebuilds the index, inside its transaction, from the rows its caller says are kept (`Rebuild`).
A new index (a fresh PostgreSQL database after `kimi-batch state migrate`) is rebuilt the same
way: the warehouse holds every kept row, so the index is never copied.

A row set aside as a repeat is recorded with the kept row it repeats (`aside`). When that kept
row leaves the index (its partition rebuilt without it, or found gone from the warehouse by the
caller's `alive` test when a row matches it), the partitions holding its repeats are marked to be
screened again (`rescreen`, read by `rescreen_partitions`): their set-aside rows are no repeats
any more. A partition screened again clears its own marks and records. The index never answers
with an entry `alive` says is gone: it drops the entry and looks further.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from functools import cache
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.crash_points import crash_point
from kimi_batch.paths import StateLocation
from kimi_batch.state import StateDatabase, connect_state, read_state

# ---- the texts and their tokens -----------------------------------------------------------------

# `normalize_text` is the exact-duplicate key: it folds only what carries no meaning, case and
# whitespace (and Unicode's canonically equivalent encodings of one character), so "2+2" and
# "2-2", "3 < 2" and "3 > 2", "C#" and "C++" stay apart; a prompt of symbols only keeps its
# symbols. `loose_text` is for comparisons that should survive re-punctuation (a benchmark item
# quoted with other quotes, a model echoing its instruction): compatibility forms folded too,
# punctuation and symbols dropped, as lm-eval's decontamination does.
#
# `text_tokens` cuts a text into the units n-grams and shingles are made of: whitespace words,
# except that every character of a script written without spaces (Chinese, Japanese kana, Thai,
# Lao, Khmer, Myanmar, Tibetan) is a token of its own, as multilingual dedup tools (text-dedup,
# CCNet) screen those scripts by character n-grams; Russian or Korean, written with spaces, keep
# word n-grams.

# Code point ranges of the scripts written without spaces between words.
_UNSPACED = (
    "\u0e00-\u0eff"  # Thai, Lao
    "\u0f00-\u0fff"  # Tibetan
    "\u1000-\u109f"  # Myanmar
    "\u1780-\u17ff"  # Khmer
    "\u2e80-\u2fdf"  # CJK and Kangxi radicals
    "\u3005-\u3007\u3021-\u3029\u3038-\u303b"  # iteration and closing marks, ideographic zero, Hangzhou numerals
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3100-\u312f\u31a0-\u31bf"  # Bopomofo
    "\u31f0-\u31ff"  # Katakana phonetic extensions
    "\u3400-\u4dbf\u4e00-\u9fff"  # CJK ideographs (extension A, unified)
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\uff66-\uff9f"  # halfwidth Katakana
    "\U00020000-\U000323af"  # CJK ideographs, extensions B to I (H: Unicode 15)
)
_TOKEN = re.compile(rf"[{_UNSPACED}]|[^\s{_UNSPACED}]+")
_WHITESPACE = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """The exact-duplicate key's text: canonical Unicode, casefolded, whitespace collapsed.

    NFC, not NFKC: compatibility folding would make "x²" the same as "x2" and "①" as "1", a
    difference of meaning in math data. Casefolded from the decomposed form, as Unicode's
    canonical caseless match (D145) does: the iota subscript (U+0345) reorders, so a composed
    Greek capital and its small letter folded apart. NFC after, the key's compact form.
    """
    folded = unicodedata.normalize("NFC", unicodedata.normalize("NFD", text).casefold())
    return _WHITESPACE.sub(" ", folded).strip()


# Punctuation (P*), symbols (S*) and format characters (Cf).
_LOOSE_DROPPED = frozenset({"Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Cf"})


def loose_text(text: str) -> str:
    """Casefolded text without punctuation or symbols (compatibility forms folded), whitespace
    collapsed: for overlap that should survive other quoting, never for the exact key."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    # Invisible format characters (Cf: a soft hyphen, a zero-width space, as text pasted from
    # the web carries) go too: a quoted copy is a copy with them.
    kept = "".join(ch for ch in folded if unicodedata.category(ch) not in _LOOSE_DROPPED)
    return _WHITESPACE.sub(" ", kept).strip()


def text_tokens(text: str) -> list[str]:
    """Whitespace words, each character of a script without spaces a token of its own."""
    return _TOKEN.findall(text)


def token_ngrams(text: str, n: int) -> Iterator[str]:
    """The token n-grams of `text`, space-joined (none when it has fewer than `n` tokens)."""
    tokens = text_tokens(text)
    for start in range(len(tokens) - n + 1):
        yield " ".join(tokens[start : start + n])


# ---- the index ----------------------------------------------------------------------------------

# datasketch's default: the similarity estimate's standard error is about 1/sqrt(128), 0.09.
NUM_PERM = 128
_SCHEME = "affine32"  # datasketch 2's default; named, since its values carry no trace of it
_SEED = 1
# What the exact key and the shingles are made of (the texts above): part of the stamp, so an
# index made under an earlier normalization (punctuation dropped, CJK as one word), or with the
# tools offered and called left out, is rebuilt (rows without tools get the keys they had).
_TEXT_VERSION = (
    "text=nfd-casefold-nfc-ws tokens=words+unspaced-chars-to-323af "
    "key=context+tools,question,answer+calls"
)
# Fixed forever (every stored band key is made with them): one odd 64-bit multiplier per
# signature position, derived from the position alone (no RNG whose stream may change).
_MULTIPLIERS = np.array(
    [
        int.from_bytes(hashlib.blake2b(f"band position {i}".encode(), digest_size=8).digest()) | 1
        for i in range(NUM_PERM)
    ],
    dtype=np.uint64,
)
# A rebuild or a landing waits this long for another partition's landing to commit.
_BUSY_TIMEOUT_S = 600.0

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS kept (
        id {serial},
        ds TEXT NOT NULL,
        source TEXT NOT NULL,
        request_id TEXT NOT NULL,
        input_id TEXT NOT NULL,
        exact {blob} NOT NULL,
        signature {blob} NOT NULL,
        context {blob}
    )""",
    "CREATE INDEX IF NOT EXISTS kept_by_partition ON kept (ds, source)",
    "CREATE INDEX IF NOT EXISTS kept_by_exact ON kept (exact)",
    """CREATE TABLE IF NOT EXISTS bands (
        band {int} NOT NULL,
        kept {int} NOT NULL,
        PRIMARY KEY (band, kept)
    )""",
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    # A row set aside as a repeat, and the kept row it repeats.
    """CREATE TABLE IF NOT EXISTS aside (ds TEXT NOT NULL, source TEXT NOT NULL,
        request_id TEXT NOT NULL, kept_ds TEXT NOT NULL, kept_source TEXT NOT NULL,
        kept_request_id TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS aside_by_partition ON aside (ds, source)",
    "CREATE INDEX IF NOT EXISTS aside_by_kept ON aside (kept_ds, kept_source, kept_request_id)",
    # Partitions whose set-aside repeats lost the row they repeat: to be screened again.
    """CREATE TABLE IF NOT EXISTS rescreen (ds TEXT NOT NULL, source TEXT NOT NULL,
        PRIMARY KEY (ds, source))""",
)
# Set-aside records of one partition's kept rows that are no longer in the index.
_ORPHANS = (
    "FROM aside WHERE kept_ds = ? AND kept_source = ? AND NOT EXISTS (SELECT 1 FROM kept "
    "WHERE kept.ds = aside.kept_ds AND kept.source = aside.kept_source "
    "AND kept.request_id = aside.kept_request_id)"
)


class DedupSetting(BaseModel):
    """What a signature is made of and when two rows are near-duplicates."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    threshold: float = Field(gt=0, lt=1, description="Estimated Jaccard similarity to match.")
    shingle: int = Field(ge=1, description="Words per shingle.")
    fields: str = Field(description="What the text is: `prompt` or `prompt+answer`.")

    def bands(self) -> tuple[int, int]:
        """(bands, rows per band): datasketch's optimum for the threshold and NUM_PERM."""
        return _optimal_bands(self.threshold)

    def stamp(self) -> str:
        """The setting's mark in the index file: signatures under another are not comparable."""
        bands, rows = self.bands()
        return (
            f"datasketch {_SCHEME} seed={_SEED} perm={NUM_PERM} shingle={self.shingle} "
            f"fields={self.fields} bands={bands}x{rows} {_TEXT_VERSION}"
        )


class KeptEntry(BaseModel):
    """A kept row, as the index names it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ds: str
    source: str
    request_id: str
    input_id: str

    @property
    def key(self) -> tuple[str, str, str]:
        return self.ds, self.source, self.request_id


class DuplicateMatch(BaseModel):
    """Why a row is not kept: the row it repeats, and how alike they are."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["duplicate", "near_duplicate"]
    kept: KeptEntry
    similarity: float


class IndexedText(BaseModel):
    """One row to check: its ids and the normalized texts it is judged on. A row repeats a
    kept one only under the same `context`; its exact key keeps the three apart."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: str
    input_id: str
    text: str = Field(description="The question.")
    answer: str | None = Field(default=None, description="Judged too, when not None.")
    calls: tuple[str, ...] = Field(
        default=(), description="The answer's tool calls, judged with it (none: no calls)."
    )
    context: str = Field(
        default="", description="The instructions, earlier turns and tools offered."
    )

    @property
    def judged(self) -> str:
        """What the MinHash signature is made of."""
        said = [self.text, *([] if self.answer is None else [self.answer]), *self.calls]
        return " ".join(said)


# Every landed (ds, source, rows) of the gated stages, oldest first: what a rebuild indexes.
Rebuild = Callable[[], Iterable[tuple[str, str, Iterable[IndexedText]]]]
# Whether a kept row of another partition is still in its table (the caller's warehouse).
Alive = Callable[[KeptEntry], bool]


@cache
def _optimal_bands(threshold: float) -> tuple[int, int]:
    from datasketch import MinHashLSH  # see _Signer: imported when first used

    lsh = MinHashLSH(threshold=threshold, num_perm=NUM_PERM)  # integrates: ~0.1 s, once
    return lsh.b, lsh.r


def shingles(text: str, size: int) -> list[bytes]:
    """The token `size`-grams of normalized `text` (a shorter text is one shingle): words, and
    single characters of a script written without spaces (`text_tokens`)."""
    words = text_tokens(text)
    if len(words) <= size:
        return [" ".join(words).encode("utf-8", "surrogatepass")]
    return [
        " ".join(words[i : i + size]).encode("utf-8", "surrogatepass")
        for i in range(len(words) - size + 1)
    ]


def _digest(text: str) -> bytes:
    # surrogatepass: a lone surrogate that reached here still has a key (never an exception).
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:16]


def _exact_key(row: IndexedText) -> bytes:
    """The three texts as one structured value: where the question ends and the answer
    begins is part of the key ("is" moved from one to the other is another row). The tool
    calls are a fourth part, only when there are some: an answer without calls keeps the key
    it was indexed under, and no answer's text makes the key of calls."""
    parts: list[object] = [row.context, row.text, row.answer]
    if row.calls:
        parts.append(list(row.calls))
    return _digest(json.dumps(parts, ensure_ascii=False))


class _Signer:
    """MinHash signatures and their LSH band hashes under one setting."""

    def __init__(self, setting: DedupSetting) -> None:
        # Imported here, not at the top: datasketch's package imports scipy (~2 s on 2 cores),
        # which every process loading the code location (code servers, run workers, the CLI)
        # would pay whether or not it screens a row.
        from datasketch import MinHash

        self._shingle = setting.shingle
        self._bands, self._rows = setting.bands()
        # Drawn once: each MinHash would otherwise draw its 128 permutations again.
        self._permutations = MinHash(num_perm=NUM_PERM, seed=_SEED, scheme=_SCHEME).permutations

    def signature(self, text: str) -> np.ndarray:
        from datasketch import MinHash

        minhash = MinHash(
            num_perm=NUM_PERM, seed=_SEED, permutations=self._permutations, scheme=_SCHEME
        )
        minhash.update_batch(shingles(text, self._shingle))
        return minhash.hashvalues.astype(np.uint32)  # affine32 values fit 32 bits

    def band_keys(self, signature: np.ndarray) -> list[int]:
        """One signed 64-bit hash per band: its values times their positions' multipliers,
        summed modulo 2**64 (two bands never share a position, so equal values in two bands
        are no match). A collision only adds a candidate, whose similarity is then checked."""
        used = self._bands * self._rows
        with np.errstate(over="ignore"):  # wrapping around 2**64 is the hash
            products = signature[:used].astype(np.uint64) * _MULTIPLIERS[:used]
            keys = products.reshape(self._bands, self._rows).sum(axis=1, dtype=np.uint64)
        return keys.view(np.int64).tolist()


def _similarity(one: np.ndarray, other: np.ndarray) -> float:
    """datasketch's Jaccard estimate: the share of equal minimums."""
    return float(np.count_nonzero(one == other)) / NUM_PERM


class PartitionDedup:
    """One partition's screening (from `DedupIndex.partition`); the transaction is its own."""

    def __init__(
        self,
        db: StateDatabase,
        held: ExitStack,
        ds: str,
        source: str,
        setting: DedupSetting,
        rebuild: Rebuild,
        alive: Alive | None = None,
    ) -> None:
        self._db, self._held, self._ds, self._source = db, held, ds, source
        self._setting, self._rebuild, self._alive = setting, rebuild, alive
        self._taken = False
        # Partitions whose entries left in this block: only their repeats can have lost theirs.
        self._left: set[tuple[str, str]] = set()
        self._signer = _Signer(setting)
        self.kept = 0
        self.rebuilt: int | None = None  # rows a rebuild indexed, when this partition did one

    def begin(self) -> None:
        """Take the index (once): rebuild it under another setting, drop this partition's
        entries."""
        if self._taken:
            return
        self._take()
        stamp = self._setting.stamp()
        found = self._db.execute("SELECT value FROM meta WHERE key = 'setting'").fetchone()
        if found is None or found[0] != stamp:
            self._rebuild_all(stamp)
        self._forget(self._ds, self._source)

    def _rebuild_all(self, stamp: str) -> None:
        found = self._db.execute("SELECT DISTINCT kept_ds, kept_source FROM aside").fetchall()
        self._left.update((str(ds), str(source)) for ds, source in found)
        self._db.execute("DELETE FROM bands")
        self._db.execute("DELETE FROM kept")
        count = 0
        for ds, source, rows in self._rebuild():
            if (ds, source) == (self._ds, self._source):
                continue  # screened now
            for row in rows:
                self._insert(ds, source, row, self._signer.signature(row.judged))
                count += 1
        self._db.execute(
            "INSERT INTO meta (key, value) VALUES ('setting', ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (stamp,),
        )
        self.rebuilt = count

    def _forget(self, ds: str, source: str) -> None:
        found = self._db.execute(
            "SELECT id, signature FROM kept WHERE ds = ? AND source = ?", (ds, source)
        ).fetchall()
        self._db.executemany(
            "DELETE FROM bands WHERE band = ? AND kept = ?",
            (
                (band, kept)
                for kept, blob in found
                for band in self._signer.band_keys(np.frombuffer(bytes(blob), dtype=np.uint32))
            ),
        )
        self._db.execute("DELETE FROM kept WHERE ds = ? AND source = ?", (ds, source))
        self._left.add((ds, source))
        # Screened now: its earlier repeats and its mark go; this screening records them again.
        self._db.execute("DELETE FROM aside WHERE ds = ? AND source = ?", (ds, source))
        self._db.execute("DELETE FROM rescreen WHERE ds = ? AND source = ?", (ds, source))

    def release(self) -> None:
        """Landed unscreened (dedup off): its entries leave; their repeats are marked."""
        self._take()
        self._forget(self._ds, self._source)

    def _take(self) -> None:
        # Held until the partition's block ends: committed then, rolled back by an error.
        self._held.enter_context(self._db.transaction())
        # Runs first at the block's end, inside the transaction: repeats of what left are marked.
        self._held.push(self._mark_orphans)
        self._taken = True

    def _mark_orphans(self, error: type[BaseException] | None, *_: object) -> bool:
        """At the block's end (no error): partitions with a repeat of a row no longer kept are
        marked to be screened again, and those records dropped."""
        for partition in sorted(self._left) if error is None else ():
            self._db.execute(
                "INSERT INTO rescreen (ds, source) SELECT DISTINCT ds, source "
                f"{_ORPHANS} ON CONFLICT DO NOTHING",
                partition,
            )
            self._db.execute(f"DELETE {_ORPHANS}", partition)
        return False

    def _drop(self, kept: int, entry: KeptEntry, signature: np.ndarray) -> None:
        """An entry whose row is gone from the warehouse (landed again with the gate off)."""
        self._left.add((entry.ds, entry.source))
        self._db.executemany(
            "DELETE FROM bands WHERE band = ? AND kept = ?",
            ((band, kept) for band in self._signer.band_keys(signature)),
        )
        self._db.execute("DELETE FROM kept WHERE id = ?", (kept,))

    def _live(self, kept: int, entry: KeptEntry, blob: object) -> bool:
        """Whether the entry's row still exists (own rows are being written); else dropped."""
        own = (entry.ds, entry.source) == (self._ds, self._source)
        if own or self._alive is None or self._alive(entry):
            return True
        self._drop(kept, entry, np.frombuffer(bytes(blob), dtype=np.uint32))  # pyright: ignore[reportArgumentType]
        return False

    def _insert(self, ds: str, source: str, row: IndexedText, signature: np.ndarray) -> None:
        (kept,) = self._db.execute(
            "INSERT INTO kept (ds, source, request_id, input_id, exact, signature, context) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
            (
                ds,
                source,
                row.request_id,
                row.input_id,
                _exact_key(row),
                signature.tobytes(),
                _digest(row.context),
            ),
        ).fetchone()
        self._db.executemany(
            "INSERT INTO bands (band, kept) VALUES (?, ?) ON CONFLICT DO NOTHING",
            ((band, kept) for band in self._signer.band_keys(signature)),
        )

    def check(self, row: IndexedText) -> DuplicateMatch | None:
        """The kept row `row` repeats, else None (and `row` is kept: indexed from now on)."""
        self.begin()
        match = self._exact(row)
        if match is None:
            signature = self._signer.signature(row.judged)
            match = self._nearest(signature, _digest(row.context))
            if match is None:
                self._insert(self._ds, self._source, row, signature)
                self.kept += 1
                return None
        self._db.execute(
            "INSERT INTO aside (ds, source, request_id, kept_ds, kept_source, kept_request_id) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (self._ds, self._source, row.request_id, *match.kept.key),
        )
        return match

    def _exact(self, row: IndexedText) -> DuplicateMatch | None:
        """The oldest kept row with the same exact key whose row still exists."""
        found = self._db.execute(
            "SELECT id, ds, source, request_id, input_id, signature FROM kept WHERE exact = ? "
            "ORDER BY id",
            (_exact_key(row),),
        ).fetchall()
        for kept, *entry, blob in found:
            if self._live(kept, _entry(tuple(entry)), blob):
                return DuplicateMatch(kind="duplicate", kept=_entry(tuple(entry)), similarity=1.0)
        return None

    def _nearest(self, signature: np.ndarray, context: bytes) -> DuplicateMatch | None:
        """The most alike kept row under the same context at or above the threshold (the
        oldest among equals)."""
        keys = self._signer.band_keys(signature)
        candidates = self._db.execute(
            "SELECT id, ds, source, request_id, input_id, signature FROM kept WHERE context = ? "
            f"AND id IN (SELECT kept FROM bands WHERE band IN ({', '.join('?' * len(keys))})) "
            "ORDER BY id",
            [context, *keys],
        ).fetchall()
        alike: list[DuplicateMatch] = []
        for kept, *entry, blob in candidates:
            similarity = _similarity(signature, np.frombuffer(bytes(blob), dtype=np.uint32))
            if similarity >= self._setting.threshold and self._live(kept, _entry(entry), blob):
                alike.append(
                    DuplicateMatch(kind="near_duplicate", kept=_entry(entry), similarity=similarity)
                )
        # The most alike; the oldest among equals (max keeps the first of equal keys).
        return max(alike, key=lambda match: match.similarity, default=None)


def _entry(found: Sequence[object]) -> KeptEntry:
    ds, source, request_id, input_id = (str(value) for value in found)
    return KeptEntry(ds=ds, source=source, request_id=request_id, input_id=input_id)


class DedupIndex:
    """The index at `location` (its SQLite file or PostgreSQL schema) under one setting."""

    def __init__(self, location: StateLocation, setting: DedupSetting) -> None:
        self.location, self.setting = location, setting

    def _connect(self) -> StateDatabase:
        db = connect_state(self.location, timeout_s=_BUSY_TIMEOUT_S)
        db.create(_SCHEMA)
        # An index made before rows were judged under their context (its stamp differs, so
        # its entries are rebuilt before use).
        db.add_columns("kept", [("context", "{blob}")])
        return db

    @contextmanager
    def partition(
        self,
        ds: str,
        source: str,
        *,
        rebuild: Rebuild = lambda: (),
        guard: Callable[[], None] | None = None,
        alive: Alive | None = None,
    ) -> Iterator[PartitionDedup]:
        """Screen partition (ds, source): its entries replaced by the rows it keeps now,
        committed when the block ends without an error and `guard` (its lease) passes; a match
        `alive` says is gone from the warehouse is dropped, not answered."""
        with self._connect() as db, ExitStack() as held:
            screen = PartitionDedup(db, held, ds, source, self.setting, rebuild, alive)
            yield screen
            screen.begin()  # a partition that kept nothing still drops its old entries
            if guard is not None:
                guard()
        crash_point("quality.index_updated")  # committed as the block's ExitStack closed

    def size_bytes(self) -> int:
        """The index file's size on disk (its WAL included); 0 on PostgreSQL."""
        path = self.location.path
        if not self.location.embedded:
            return 0
        files = [path, path.with_name(path.name + "-wal")]
        return sum(f.stat().st_size for f in files if f.exists())

    def release(self, ds: str, source: str) -> None:
        """Partition (ds, source) landed without screening: its old entries must not answer
        for rows it may no longer hold. Nothing is created when there is no index yet."""
        probe = read_state(self.location)
        if probe is None:
            return
        probe.close()
        with self._connect() as db, ExitStack() as held:
            PartitionDedup(db, held, ds, source, self.setting, lambda: ()).release()
        crash_point("quality.index_released")  # committed as the block's ExitStack closed


def index_entries(location: StateLocation) -> int | None:
    """Kept rows in the index at `location`, read only (None: no index yet)."""
    db = read_state(location)
    if db is None:
        return None
    with db:
        return int(db.execute("SELECT count(*) FROM kept").fetchone()[0])


def rescreen_partitions(location: StateLocation) -> list[tuple[str, str]]:
    """(ds, source) of the partitions whose set-aside repeats lost the row they repeat: to be
    screened again (read only; none without an index)."""
    db = read_state(location)
    if db is None:
        return []
    with db:
        if not db.columns("rescreen"):
            return []  # an index from before the table: nothing marked yet
        found = db.execute("SELECT ds, source FROM rescreen ORDER BY ds, source").fetchall()
        return [(str(ds), str(source)) for ds, source in found]
