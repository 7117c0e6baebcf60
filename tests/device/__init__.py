"""GPU buffers: the CUDA kernels and collectives on a real GPU (skipped without
one), and the device data path on the host-memory emulation of the device
runtime (emulated_device/)."""
