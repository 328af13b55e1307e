"""What the supervisor gives a worker: its index, the count, its descriptors."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class WorkerSetup:
    """What the supervisor gives a worker: its index, the count, its descriptors (forked, the
    supervisor's own; started with --worker, the ones passed to the new process)."""

    index: int
    count: int
    control_fd: int
    listen_fds: tuple[int, ...] = ()
    unix_fd: int | None = None
