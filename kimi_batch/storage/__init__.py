"""The file primitives several features share (`private_files`: a regular file opened for
reading, owner-only writes, a folder swapped in whole, stale temps removed; `blobs`:
content-addressed files every host reads; `java_properties`: a value as Java's `Properties.load`
reads it) and the storage errors (`exceptions`). The landed input versions, which once lived
here, are the inputs feature's (`kimi_batch.inputs`). Other packages import from here, never
from the modules.
"""

from kimi_batch.storage.blobs import BlobStore, SharedBlobs
from kimi_batch.storage.exceptions import (
    InvalidIdentifierError,
    InvalidPartitionError,
    StorageError,
)
from kimi_batch.storage.java_properties import property_value
from kimi_batch.storage.private_files import (
    REFUSED_SPECIAL,
    NotRegularFileError,
    open_regular,
    pid_alive,
    private_folder,
    private_folder_swap,
    private_writer,
    regular_file,
    remove_stale_temps,
    temp_name,
    write_private_text,
)

__all__ = [
    "REFUSED_SPECIAL",
    "BlobStore",
    "InvalidIdentifierError",
    "InvalidPartitionError",
    "NotRegularFileError",
    "SharedBlobs",
    "StorageError",
    "open_regular",
    "pid_alive",
    "private_folder",
    "private_folder_swap",
    "private_writer",
    "property_value",
    "regular_file",
    "remove_stale_temps",
    "temp_name",
    "write_private_text",
]
