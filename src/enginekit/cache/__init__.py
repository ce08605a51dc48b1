"""Content-addressed local store with atomic writes and a lock per key.

Every result enginekit computes (an ONNX file, an engine plan, a parity report) is stored under
a key made of everything that determines it (``enginekit.hashing.key_for``), so a second run with
the same inputs does no work.

Layout under the root (``default_root()``)::

    <kind>/<key>/                 one entry: the producer's files plus manifest.json (``enginekit.manifest``)
    .locks/<kind>-<key>.lock      one lock per key, held while the key is built or removed
    .tmp/<kind>-<key>-<pid>-<r>/  an entry being built; renamed into place when complete
    .trash/                       entries moved aside before deletion
    .inuse/<kind>-<key>/<pid>-<r> a run using the entry holds a lock on this file: gc and purge
                                  keep the entry (the kernel drops the lock when the run ends)

A reader never sees half an entry: an entry folder only appears by ``os.rename`` of a complete
temp folder that already holds its ``manifest.json``, and only disappears by a rename into
``.trash``. A corrupt entry (missing file, size or sha256 mismatch, unreadable manifest) is
reported and moved aside, never served.

Reporting: ``lookup`` returns a ``LookupResult`` with a status of "hit", "miss" or "corrupt"
and, for "corrupt", the reason. ``get_or_create`` returns ``(entry, status)`` with a status of
"hit", "miss" (built, nothing was there), "corrupt" (rebuilt over a corrupt entry) or "forced"
(rebuilt on request). Both also leave the reason of the last corruption they found in
``Cache.last_corruption`` (None when there was none), so a caller can report it.

Under it, optionally, the team store (``enginekit.store``): lookups go local -> store -> build,
a pulled entry is checked file by file against its sha256 before it is renamed into place, and
what is built is pushed back (engines only once their gates passed: ``publish``). A store that
fails never fails the lookup: one warning, then local only.

The package, by concept: ``entries`` (what it hands out; where it lives), ``local`` (find, build,
lock), ``tiered`` (the store under it), ``admin`` (ls, resolve, gc, purge), ``inuse`` (entries a run
holds), ``files`` (file-system helpers). Only the standard library, ``filelock`` and ``psutil`` (and
the store's client when one is configured): no torch, onnx or tensorrt here.
"""

from __future__ import annotations

from enginekit.cache.admin import Cache
from enginekit.cache.inuse import holding_entries
from enginekit.cache.local import DEFAULT_LOCK_TIMEOUT, PUBLISHED_BY_FLOWS, Produce
from enginekit.cache.entries import Entry, EntryInfo, Explanation, LookupResult, default_root, location_problem

__all__ = ["Cache", "Entry", "EntryInfo", "Explanation", "LookupResult", "Produce", "DEFAULT_LOCK_TIMEOUT",
           "PUBLISHED_BY_FLOWS", "default_root", "holding_entries", "location_problem"]
