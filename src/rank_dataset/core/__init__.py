"""The building blocks every layer uses: argument checks, threads, progress bars, the line parsers,
shared memory, stage timers and the :class:`~rank_dataset.core.shard.Shard` (a rank's lines as bytes +
offsets); the per-line kernels (:mod:`rank_dataset.core.native`: C loaded with ctypes, or their numpy
reference). The bottom layer: it imports nothing else of the package.
"""
