"""service.processes.stop_tree: what it stops, and how."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from service.processes import alive, descendants, stop_tree

# a child that, on SIGTERM, notes it and exits (as `ray start --block` stops its head in order)
CHILD = """
import pathlib, signal, sys, time
def stop(*_):
    pathlib.Path(sys.argv[1]).write_text("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
time.sleep(600)
"""
# a parent that starts it in a process group of its own (as `sweeps serve` starts its Ray head)
PARENT = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], process_group=0)
time.sleep(600)
"""


def test_a_child_in_its_own_group_is_asked_to_stop_then_nothing_is_left(tmp_path: Path) -> None:
    marker = tmp_path / "child-stopped"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, str(marker)], process_group=0)
    deadline = time.monotonic() + 30
    while not (tree := descendants(parent.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(tree) == 1, tree
    time.sleep(0.5)  # the child's handler is installed
    stop_tree(parent.pid, proc=parent)
    # SIGTERMed (its handler ran), not only SIGKILLed 10 s later: it could stop what is below it in order
    assert marker.read_text() == "SIGTERM"
    assert parent.returncode is not None and not any(alive(p) for p in tree)
