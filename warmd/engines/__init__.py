"""The serving engine as it is launched: its command line, its environment and its version
decide which kernels it will JIT-compile. Everything here is plain data plus small parsers;
the rules each cite the engine source file they follow (docs/selection.md lists them)."""
