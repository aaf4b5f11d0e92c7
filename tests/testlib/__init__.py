"""testlib: a small real JIT library for the shared-cache tests, registered like
warmd/libraries/deep_gemm and flashinfer (``warmd.libraries.register("testlib.library")``,
and ``WARMD_LIBRARY_PACKAGES=testlib.library`` for warmup's worker processes).

Its executor "compiles" a task's entries (``spec["entries"]``) into its cache root, one
directory of real files each, and its cache adapter packs and installs those directories
(warmd.cache.packing and install, like the real adapters). No GPU is needed, so warmd's real warmup
loop (fetch, single flight, compile in a worker, publish) runs end to end in the tests.

The LIBRARY is in testlib/library.py, which only the registry imports: a module that
warmd.libraries imports must not itself be imported first (it would import warmd.libraries
half-way through defining LIBRARY).
"""

from __future__ import annotations

NAME = "testlib"
LIBRARY_MODULE = "testlib.library"  # what registers it
ROOT_ENV = "WARMD_TESTLIB_DIR"  # set by warmup in its workers, like DG_JIT_CACHE_DIR
