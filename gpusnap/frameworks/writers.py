"""Writers whose state a native library holds in its own memory, where neither the snapshot's
object graph nor the files it keeps can carry it: at a snapshot where one holds some, restore
refuses, naming it, rather than go on with the replay's writer, which holds none of it
(``capture.pickling.pickler.UNKEPT``). Outside those moments each is live-only, as before.

- An ``sqlite3.Connection`` inside a transaction holds the rows inserted since its last commit
  in SQLite's pages; its database file is kept with the program's files (``files.watch``). Rows
  inserted each epoch and committed once at the end restarted "verified" without the epochs
  before the snapshot (``tests/programs/corpus/sqlite_metrics.py --commit-at-end``, 3 of 3).
- An open ``pyarrow.parquet.ParquetWriter`` holds the footer that lists its row groups, written
  at ``close()``; the replay's writer truncated the file in setup, and a metrics file streamed a
  row group per epoch restarted "verified" with the epochs after the snapshot only
  (``tests/programs/corpus/parquet_log.py``, 3 of 3).
- A ``gzip.GzipFile``, ``bz2.BZ2File`` or ``lzma.LZMAFile`` open for writing holds its
  compressor's state (zlib's, libbz2's, liblzma's), which no Python API reads out; the replay's
  compressor would go on with a stream of its own after the run's bytes, and the file would end
  with a checksum of neither (a snapshot cannot flush it either: that adds a sync point, and the
  file would differ from an uninterrupted run's).

A ``csv.writer`` (over a file the program keeps open, or a ``StringIO``) holds its file in C,
where pickle cannot reach it: it was live-only, and one made after setup (a logger's, at its
first record) was gone after a restart. Where the program held it in a local that the replay
bound to None, the program made it again over its log opened anew, truncated: "verified", the
rows before the snapshot lost (``tests/programs/corpus/csv_log.py --lazy``, 2 of 2). So
``csv.writer`` is wrapped to note the file each writer writes through (``csv_writer``), and a
snapshot keeps the writer as that file and its dialect (``pickler.OVER_FILES``): restore makes
it again over the file's live counterpart (the file opened again, where the replay made none).
"""

from __future__ import annotations

from gpusnap.capture.pickling.pickler import OVER_FILES, UNKEPT
from gpusnap.onimport import after_import

UNKEPT["sqlite3.Connection"] = (
    lambda connection: connection.in_transaction,  # sqlite3_get_autocommit: a field
    "held changes not yet committed, which live in SQLite's memory, not in the database file",
    "commit after each write (db.commit(), or `with db:`) so that a snapshot finds them in the file; "
    "--snapshot ID restores an earlier snapshot",
)
UNKEPT["pyarrow.parquet.core.ParquetWriter"] = (
    lambda writer: writer.is_open,  # a Python attribute; close() clears it
    "was open, and the footer listing the row groups it wrote lives in Arrow's memory until close()",
    "write each epoch's rows as a file of its own (pyarrow.parquet.write_table), or open the writer after "
    "training; --snapshot ID restores an earlier snapshot",
)
_COMPRESSING = (
    lambda stream: not stream.closed and stream.writable(),  # Python attributes: mode, fileobj
    "was open for writing: its compressor's state lives in the compression library's memory",
    "open it in each epoch to append a member of its own (gzip.open(path, 'at'), closed before the next "
    "snapshot), or write the file uncompressed; --snapshot ID restores an earlier snapshot",
)
for _name in ("gzip.GzipFile", "bz2.BZ2File", "lzma.LZMAFile"):
    UNKEPT[_name] = _COMPRESSING


_DIALECT = ("delimiter", "doublequote", "escapechar", "lineterminator", "quotechar", "quoting", "skipinitialspace", "strict")
_made: dict[int, tuple] = {}  # id(writer) -> (writer, its file): held, so that an id is never another writer's
_csv_writer = None  # the csv module's own


def csv_writer(csvfile, *args, **kwargs):
    """``csv.writer``, noting the file the writer writes through."""
    made = _csv_writer(csvfile, *args, **kwargs)
    if len(_made) >= 256:  # a writer per row, or per epoch's file: let go of those over closed files
        for key, (_, file) in list(_made.items()):
            if getattr(file, "closed", False):
                del _made[key]
    _made[id(made)] = (made, csvfile)
    return made


csv_writer.__gpusnap_wrapped__ = True


def _over_its_file(writer):
    entry = _made.get(id(writer))
    if entry is None or entry[0] is not writer:
        return None
    dialect = writer.dialect
    return entry[1], csv_writer, {name: getattr(dialect, name) for name in _DIALECT}


def _csv(module) -> None:
    global _csv_writer
    if getattr(module.writer, "__gpusnap_wrapped__", False):
        return
    _csv_writer = module.writer
    csv_writer.__doc__ = _csv_writer.__doc__
    module.writer = csv_writer  # DictWriter makes its writer through the module's name too


OVER_FILES["_csv.writer"] = _over_its_file
after_import("csv", _csv)
