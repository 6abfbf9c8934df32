"""What keeps the service's files from the machine's other users: the umask of the service and of every
process it starts, and the data dir's mode.

`sweeps serve` (and `python -m service`) set `PRIVATE_UMASK` first and make the data dir private
(`private_dir`) before anything opens a store in it; the local Ray head starts with the same umask
(`service/cluster/ray_head.py`), and the sweep drivers and trials below it inherit it. Ray makes some
folders of its own mode 0777 whatever the umask (logs, sockets): they are inside the data dir, which no
other user can enter.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from sweeps.logs import configure as configure_logs

if TYPE_CHECKING:
    from service.settings import Settings

log = logging.getLogger(__name__)

PRIVATE_UMASK = 0o077  # files 0600, folders 0700: their owner's alone


def private_dir(path: Path) -> Path:
    """`path` as a folder only its owner can enter: created mode 0700 (its missing parents as the umask
    makes them), or tightened to 0700 where it exists with more (logged). A folder this user does not own
    and so cannot tighten (a Kubernetes emptyDir of fsGroup, where one user runs everything) is logged
    and used as it is."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        try:
            path.chmod(0o700)
        except PermissionError:
            log.warning("%s is mode %04o and not this user's to tighten: other users may reach it", path, mode)
        else:
            log.warning("%s was mode %04o: tightened to 0700 (no other user may read or write in it)", path, mode)
    return path


def start_private(settings: Settings, log_level: str = "info") -> None:
    """First in `sweeps serve` and `python -m service`, before any store opens: the umask, then the data dir."""
    # other users of the machine must reach nothing the service or what it starts (Ray head, drivers, trials) writes
    os.umask(PRIVATE_UMASK)
    configure_logs(settings.log_format, log_level)  # a tightened data dir is logged as the service logs
    private_dir(settings.data_dir)
