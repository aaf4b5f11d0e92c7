"""Operator views and maintenance of the shared cache, one module per command:

    ls.py         fingerprints, the entries of one, learned indexes  (warmd cache ls)
    totals.py     cluster-wide counters per node and fingerprint     (warmd cache stats)
    verify.py     check every entry as a fetch would                 (warmd cache verify)
    prune.py      remove old, disowned and unreferenced data         (warmd cache prune)
    export.py     verified entries to a tar archive                  (warmd cache export)
    importing.py  an archive back, verified                          (warmd cache import)
    archive.py    the archive's format;  reads.py  what every command reads

Everything runs through a StoreSharedCache's operator surface (`op`, `accept_manifest`,
`accept_record`, its entries, publisher and stats: same connection, timeouts and
verification as warmup's fetch) but lets store errors surface as StoreFailed: an operator
asked. Keys come from warmd.store.layout only. `op` is Redis's client (the backend's
client_op): on another store what needs it fails with one line saying it needs Redis.
"""

from warmd.store.admin.archive import EXPORT_FORMAT, UnsafeArchive
from warmd.store.admin.export import export_archive
from warmd.store.admin.importing import import_archive
from warmd.store.admin.ls import entry_json, learned_indexes, listing
from warmd.store.admin.prune import PruneReport, prune, select_fingerprints
from warmd.store.admin.reads import entries, fingerprints
from warmd.store.admin.totals import read_stats
from warmd.store.admin.verify import VerifyReport, verify

__all__ = ["EXPORT_FORMAT", "PruneReport", "UnsafeArchive", "VerifyReport", "entries",
           "entry_json", "export_archive", "fingerprints", "import_archive",
           "learned_indexes", "listing", "prune", "read_stats", "select_fingerprints",
           "verify"]
