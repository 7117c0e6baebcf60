"""Bad input and bad days: errors naming rank and op, kill -9, cut links, shrink,
torchrun restarts, rendezvous on a used store, clean process exits, the soak."""
