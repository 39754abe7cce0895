"""What a trainer reads, beside the `kimi-batch export` command (`cli/export.py`): the `kd`
rows (`kd`), the tokenizer their ids belong to (`tokenizer`), the `hf` dataset card (`card`).
No Dagster here."""

from kimi_batch.exports.kd import kd_line, kd_record
from kimi_batch.exports.tokenizer import TokenizerIdentity, tokenizer_identity

__all__ = ["TokenizerIdentity", "kd_line", "kd_record", "tokenizer_identity"]
