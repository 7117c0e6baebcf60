"""Collectives: every op, dtype, reduce op, size and world against numpy, over shared
memory, TCP and rings that mix them (emulated hosts); float8, the numpy-facing
buffers, point-to-point connections made on first use."""
