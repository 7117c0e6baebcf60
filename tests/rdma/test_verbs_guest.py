"""Runs tests/rdma/test_verbs.py inside the Soft-RoCE guest (one boot for the whole file).

The verbs transport needs an RDMA device; this machine's kernel has none, so the
suite runs in a QEMU guest with Debian's kernel and rdma_rxe on a veth pair
(scripts/softroce/guest.py). Skipped with the reason when QEMU or the kernel
package is unavailable, unless RCOLL_REQUIRE_SOFTROCE=1 (set by .ci/run), where
a guest that cannot start is a failure: CI must not pass by skipping it.

The guest starts with the session, beside the other tests (tests/support/guest_suite.py);
this test waits for its outcome.
"""
import re

import pytest
from support import guest_suite, optional
from support.softroce import SOFTROCE_HINT, guest_available, in_guest

pytestmark = pytest.mark.slow  # the verbs suite in a QEMU guest (~20 min)


@pytest.mark.softroce
@pytest.mark.timeout(guest_suite.GUEST_TIMEOUT_S + 300)
def test_verbs_suite_in_the_softroce_guest():
    if in_guest():
        pytest.skip("already inside the guest (tests/rdma/test_verbs.py runs directly here)")
    ok, reason = guest_available()
    if not ok:
        optional.missing("softroce", f"the Soft-RoCE guest is unavailable: {reason}; {SOFTROCE_HINT}")
    # The same interpreter and PYTHONPATH as this test (passed through), so the
    # guest imports the rcoll under test: the venv's in CI, the tree's in development.
    proc = guest_suite.result()
    report = f"--- guest stdout:\n{proc.stdout[-20000:]}\n--- guest stderr:\n{proc.stderr[-5000:]}"
    print(report)
    assert proc.returncode == 0, report
    summary = re.search(r"(\d+) passed", proc.stdout)
    assert summary and int(summary.group(1)) >= 20, report  # the suite really ran in the guest
    assert " skipped" not in proc.stdout.splitlines()[-1], report
