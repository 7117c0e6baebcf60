"""Horovod's API on rcoll: a Horovod training script runs unchanged but for its
import line (`import rcoll.horovod.torch as hvd`). docs/horovod.md is the
migration guide."""
