"""Jobs across emulated hosts (network namespaces joined by shaped links):
multi-node torchrun, bench/netem.py and bench/scale.py."""
