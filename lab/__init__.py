"""Test infrastructure and the studies behind docs pages; in the repository, not installed.

testbed.py, delay.py and loopback_faults.py give tasks their own namespaces, links and faults;
chaos.py is `make chaos`; scaling.py, straggler.py and sparse_bytes.py are the studies. Run each
from the repository root as `python -m lab.NAME`.
"""

from pathlib import Path

# The repository root: where `python -m lab.NAME` finds lab/ in a process of its own.
ROOT = str(Path(__file__).resolve().parents[1])
