"""What Horovod's front ends share: the job (init, ranks, process sets) and the errors."""
