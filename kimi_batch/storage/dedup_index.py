"""The duplicate index: every kept row of a gated stage, across every night, in the state dir.

One SQLite file holds, per kept row, its partition, ids, exact key (the sha256 of its normalized
text) and MinHash signature (datasketch, 128 permutations, word shingles). A partition is
screened inside one write transaction (`DedupIndex.partition`): its own earlier entries are
dropped first (a rebuilt partition replaces them), every other partition's entries are loaded
into an in-memory `MinHashLSH`, each row is checked against them and the rows kept before it,
and the partition's kept rows are committed when the block ends without an error. Two
partitions landing at once are serialized by the transaction; a run that dies mid-way leaves
the index as it was.

The signature settings (shingle size, fields) are part of the index: a file made under others is
rebuilt, from the warehouse, by the caller (`needs_rebuild`, `rebuild`).
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import numpy as np
from datasketch import LeanMinHash, MinHash, MinHashLSH
from pydantic import BaseModel, ConfigDict

from kimi_batch.paths import connect_private_db, private_dir

__all__ = [
    "NUM_PERM",
    "DedupIndex",
    "DuplicateMatch",
    "IndexedText",
    "KeptEntry",
    "PartitionDedup",
    "shingles",
]

# datasketch's default: the estimate's standard error is about 1/sqrt(128), 0.09.
NUM_PERM = 128
_SCHEME = "affine32"
_SEED = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kept (
    ds TEXT NOT NULL,
    source TEXT NOT NULL,
    request_id TEXT NOT NULL,
    input_id TEXT NOT NULL,
    exact TEXT NOT NULL,
    signature BLOB NOT NULL,
    PRIMARY KEY (ds, source, request_id)
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class KeptEntry(BaseModel):
    """A kept row, as the index names it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ds: str
    source: str
    request_id: str
    input_id: str


class DuplicateMatch(BaseModel):
    """Why a row is not kept: the row it repeats, and how alike they are."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["duplicate", "near_duplicate"]
    kept: KeptEntry
    similarity: float


class IndexedText(BaseModel):
    """One row to index: its ids and the normalized text it is judged on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: str
    input_id: str
    text: str


def shingles(text: str, size: int) -> list[bytes]:
    """The word `size`-grams of normalized `text` (a shorter text is one shingle)."""
    words = text.split()
    if len(words) <= size:
        return [" ".join(words).encode()]
    return [" ".join(words[i : i + size]).encode() for i in range(len(words) - size + 1)]


def _exact_key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _signature(text: str, shingle: int, permutations: object) -> LeanMinHash:
    minhash = MinHash(num_perm=NUM_PERM, seed=_SEED, permutations=permutations, scheme=_SCHEME)
    minhash.update_batch(shingles(text, shingle))
    return LeanMinHash(minhash)


def _from_blob(blob: bytes) -> LeanMinHash:
    values = np.frombuffer(blob, dtype=np.uint32)
    return LeanMinHash(seed=_SEED, hashvalues=values, scheme=_SCHEME)


class PartitionDedup:
    """One partition's screening, inside the index's transaction (`DedupIndex.partition`)."""

    def __init__(
        self, db: sqlite3.Connection, ds: str, source: str, threshold: float, shingle: int
    ) -> None:
        self._db, self._ds, self._source, self._shingle = db, ds, source, shingle
        self._permutations = MinHash(num_perm=NUM_PERM, seed=_SEED, scheme=_SCHEME).permutations
        self._lsh = MinHashLSH(threshold=threshold, num_perm=NUM_PERM)
        self._exact: dict[str, KeptEntry] = {}
        self._entries: dict[int, tuple[KeptEntry, LeanMinHash]] = {}
        rows = db.execute(
            "SELECT ds, source, request_id, input_id, exact, signature FROM kept"
            " ORDER BY ds, source, rowid"
        )
        for ds_, source_, request_id, input_id, exact, blob in rows:
            entry = KeptEntry(ds=ds_, source=source_, request_id=request_id, input_id=input_id)
            self._remember(entry, exact, _from_blob(blob))
        self.indexed = len(self._entries)

    def _remember(self, entry: KeptEntry, exact: str, signature: LeanMinHash) -> None:
        self._exact.setdefault(exact, entry)  # the first one stays the one named
        key = len(self._entries)
        self._entries[key] = (entry, signature)
        self._lsh.insert(key, signature, check_duplication=False)

    def check(self, row: IndexedText) -> DuplicateMatch | None:
        """The kept row `row` duplicates, else None (and `row` is kept: indexed from now on)."""
        exact = _exact_key(row.text)
        known = self._exact.get(exact)
        if known is not None:
            return DuplicateMatch(kind="duplicate", kept=known, similarity=1.0)
        signature = _signature(row.text, self._shingle, self._permutations)
        candidates = [self._entries[key] for key in self._lsh.query(signature)]
        if candidates:
            alike = [(signature.jaccard(other), entry) for entry, other in candidates]
            similarity, entry = max(alike, key=lambda pair: pair[0])
            return DuplicateMatch(kind="near_duplicate", kept=entry, similarity=similarity)
        entry = KeptEntry(
            ds=self._ds, source=self._source, request_id=row.request_id, input_id=row.input_id
        )
        self._remember(entry, exact, signature)
        self._db.execute(
            "INSERT OR REPLACE INTO kept VALUES (?, ?, ?, ?, ?, ?)",
            (
                self._ds,
                self._source,
                row.request_id,
                row.input_id,
                exact,
                signature.hashvalues.astype(np.uint32).tobytes(),
            ),
        )
        return None


class DedupIndex:
    """The index file at `path`, for one signature setting (`shingle` words, `fields`)."""

    def __init__(self, path: Path, *, threshold: float, shingle: int, fields: str) -> None:
        self._path, self._threshold, self._shingle = path, threshold, shingle
        # What a stored signature was made of: another setting makes them incomparable.
        self._setting = f"perm={NUM_PERM} scheme={_SCHEME} shingle={shingle} fields={fields}"

    def _connect(self) -> sqlite3.Connection:
        private_dir(self._path.parent)
        db = connect_private_db(self._path, timeout_s=600.0)
        db.executescript(_SCHEMA)
        return db

    def needs_rebuild(self) -> bool:
        """Whether the file is new or was made under another signature setting."""
        db = self._connect()
        try:
            row = db.execute("SELECT value FROM meta WHERE key = 'setting'").fetchone()
        finally:
            db.close()
        return row is None or row[0] != self._setting

    def rebuild(self, partitions: Iterable[tuple[str, str, Iterable[IndexedText]]]) -> int:
        """Replace every entry by `partitions`' rows (ds, source, rows; oldest first), each
        kept as it comes (duplicates already landed stay where they are); the rows indexed."""
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute("DELETE FROM kept")
            permutations = MinHash(num_perm=NUM_PERM, seed=_SEED, scheme=_SCHEME).permutations
            count = 0
            for ds, source, rows in partitions:
                for row in rows:
                    signature = _signature(row.text, self._shingle, permutations)
                    db.execute(
                        "INSERT OR REPLACE INTO kept VALUES (?, ?, ?, ?, ?, ?)",
                        (
                            ds,
                            source,
                            row.request_id,
                            row.input_id,
                            _exact_key(row.text),
                            signature.hashvalues.astype(np.uint32).tobytes(),
                        ),
                    )
                    count += 1
            db.execute(
                "INSERT OR REPLACE INTO meta VALUES ('setting', ?)", (self._setting,)
            )
            db.execute("COMMIT")
            return count
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        finally:
            db.close()

    @contextmanager
    def partition(self, ds: str, source: str) -> Iterator[PartitionDedup]:
        """Screen partition (ds, source): its old entries replaced by the rows it keeps now,
        committed when the block ends without an error (see the module docstring)."""
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute("DELETE FROM kept WHERE ds = ? AND source = ?", (ds, source))
            yield PartitionDedup(db, ds, source, self._threshold, self._shingle)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        finally:
            db.close()

    def size_bytes(self) -> int:
        """The index file's size on disk (its WAL included)."""
        files = [self._path, self._path.with_name(self._path.name + "-wal")]
        return sum(f.stat().st_size for f in files if f.exists())

    def entries(self) -> int:
        db = self._connect()
        try:
            return int(db.execute("SELECT count(*) FROM kept").fetchone()[0])
        finally:
            db.close()
