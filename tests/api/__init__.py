"""The surfaces around the collectives: settings (RCOLL_*), rcoll.spawn, the
timeline, `python -m rcoll bench`, and the job-running helpers of support/launch.py."""
