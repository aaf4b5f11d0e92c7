"""warmd: distributed warmup and kernel-cache daemon for GPU inference clusters."""

__version__ = "0.1.0"
