"""Where things are: the checkout (ROOT), its tests/ directory (TESTS), and the
job scripts that tests of several areas run under torchrun (JOURNEYS)."""
import os
from pathlib import Path

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TESTS)
JOURNEYS = Path(TESTS) / "torch_backend" / "journeys"
