"""Stand-ins for what a ChannelBoard drives: listening clients and a listener link."""

from __future__ import annotations

from pgtarn.pool.channels import ChannelBoard


class FakeSubscriber:
    """A listening client: keeps what the board tells it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.notified: list[bytes] = []
        self.confirmations: list[str] = []
        self.losses = 0
        self.releases = 0

    def __repr__(self) -> str:
        return self.name

    def notify(self, message: bytes) -> None:
        self.notified.append(message)

    def listener_confirmed(self, warning: str) -> None:
        self.confirmations.append(warning)

    def listener_lost(self) -> None:
        self.losses += 1

    def release_notifications(self) -> None:
        self.releases += 1


class FakeLink:
    """The listener connection: counts the board's commands."""

    def __init__(self, board: ChannelBoard) -> None:
        self.board = board
        self.syncs: list[set[str]] = []  # what was wanted at each sync
        self.ticks: list[float] = []
        self.restarts: list[str] = []
        self.closes: list[str] = []
        self.held: list[bool] = []  # each hold()

    def sync(self) -> None:
        self.syncs.append(self.board.wanted())

    def tick(self, now: float) -> None:
        self.ticks.append(now)

    def hold(self, held: bool) -> None:
        self.held.append(held)

    def restart(self, reason: str) -> None:
        self.restarts.append(reason)

    def close(self, reason: str) -> None:
        self.closes.append(reason)
