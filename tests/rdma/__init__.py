"""The ibverbs transport, run for real inside the Soft-RoCE QEMU guest
(scripts/softroce/guest.py; support/guest_suite.py starts it with the session)."""
