"""The torch.distributed backend "rcoll": every dispatched call, torch's own
DistributedTest suite, the training frameworks, and the user journeys (jobs
under torchrun and launcher environments; the scripts are in journeys/)."""
