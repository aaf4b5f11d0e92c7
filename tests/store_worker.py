"""A warmup process for the multi-process shared-cache tests (argv[1]: JSON arguments):
warmd's run_warmup over the test library, sharing through a real store."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from store_support import DirAdapter, warm

from warmd.store import open_shared_cache


def main() -> None:
    args = json.loads(sys.argv[1])
    cache = open_shared_cache(args["url"], node=args["node"],
                              lease_seconds=args.get("lease_seconds", 30.0),
                              kernel_lease_seconds=args.get("lease_seconds", 3.0),
                              poll_interval=args.get("poll_interval", 0.2))
    adapter = DirAdapter(Path(args["root"]))
    counts = warm(cache, adapter, args["plan"], Path(args["log"]), args.get("seconds", 0.0))
    cache.close()
    print(json.dumps({"counts": counts, "store": cache.stats.counters}))


if __name__ == "__main__":
    main()
