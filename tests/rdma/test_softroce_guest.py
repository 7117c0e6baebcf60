"""The Soft-RoCE guest boots and has working ibverbs (scripts/softroce/guest.py)."""


import pytest
from support import optional
from support.softroce import SOFTROCE_HINT, guest_available, run_guest_check

pytestmark = pytest.mark.slow  # boots a QEMU guest

# Boot + setup + checks take ~30 s on an idle 2-core machine, several times that
# when it is busy; the guest itself is bounded by GUEST_TIMEOUT_S.
GUEST_TIMEOUT_S = 600


@pytest.mark.softroce
@pytest.mark.timeout(GUEST_TIMEOUT_S + 120)
def test_guest_boots_and_self_check_passes():
    ok, reason = guest_available(for_check=True)
    if not ok:
        optional.missing("softroce", f"the Soft-RoCE guest is unavailable: {reason}; {SOFTROCE_HINT}")
    proc = run_guest_check(timeout=GUEST_TIMEOUT_S)
    report = f"--- stdout:\n{proc.stdout}\n--- stderr:\n{proc.stderr}"
    assert proc.returncode == 0, report
    for line in ("CHECK PASS: ibv_devices lists rxe0 and rxe1",
                 "CHECK PASS: rxe0 has a RoCE v2 IPv4 GID at index",
                 "CHECK PASS: ibv_rc_pingpong rxe0 -> rxe1",
                 "CHECK PASS: RoCE traffic crossed the veth pair",
                 "CHECK PASS: pyverbs lists rxe0 to rxe5",
                 "CHECK SUMMARY: 6 passed, 0 failed"):
        assert line in proc.stdout, report
