"""Capture what the engine really compiles on a node, share it, and count JIT after READY.

After a node is READY its agent watches every registered library's cache directories
(``CacheAdapter.watch_dirs``; inotify through watchdog, else polling, and a periodic rescan
either way), in a thread of its own: a FIFO, a slow disk or a huge cache never holds up
the agent's heartbeats. Each complete entry that appears is a *runtime JIT*: a kernel the
warmup did not predict, compiled in traffic. It is recorded (library, entry, node, time),
counted once per entry for the life of the capture (an entry that disappears and comes back
is not counted again), and shared according to the cluster's trust in what its serving
nodes' caches hold (``CaptureTrust``, warmd.yaml ``capture.trust``):

- ``rederive`` (the default): what a node captured is a *pending capture*, not code. It is verified
  (its adapter packs it: complete entries only, no links, no odd names; the archive check
  refuses traversal, devices and oversize) and stored unsigned in the pending tier
  (``SharedCache.captures.submit``), which no node installs. A trusted producer rebuilds it
  from its recorded source and flags (warmd.rederive) and publishes what *it* built, signed,
  as a *learned* entry of every plan the capture names.
- ``own-nodes``: the capturing node publishes the verified entry itself, signed with the
  cluster key, as a learned entry (for a small cluster whose serving nodes are as trusted as
  its builders: anything that can write into an engine's cache then reaches every node).
- ``off``: runtime JIT is counted and nothing is shared.

A learned entry is published through the shared cache's task path (``publish_task``): one
task record per entry, ``learned_task(plan, entry)``, its manifest once per fingerprint; its
name joins the plan's learned index (``SharedCache.lists.add_learned``, a set, so nodes capturing
at once lose nothing). Every node that warms the plan installs it before READY
(``install_learned``, through ``prefetch``: the same verification as any task).

A scan on start shares every complete entry on disk that no local task record names and the
store does not hold yet (learned, or pending), so a watcher that fell behind or restarted
loses nothing; entries present at start are not counted as runtime JIT (a restarted agent
re-warms first). Every error is caught per entry and counted (``capture_failed``): a bad
entry never stops a scan.

Its parts: ``scope.py`` (what a capture covers), ``watch.py`` (``Capture``: the watch,
the count and the trust), ``sharing.py`` (pending captures, learned entries).
"""
