"""A login's welcome: ParameterStatus, BackendKeyData and ReadyForQuery, and a cache of them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

from .. import native
from . import build
from .cancelkey import Key
from .parameters import reported_form

_RFQ_IDLE = build.ready_for_query(b"I")


def welcome_ended(statuses: bytes, pid: int, secret: int) -> bytes:
    """statuses, then BackendKeyData (pid, secret) and ReadyForQuery idle: the pure build's
    welcome_end."""
    return statuses + build.backend_key_data(pid, secret) + _RFQ_IDLE


#: native/_startup.c's when built, else the pure build's.
WELCOME_END: Final = welcome_ended if native.welcome_end is None else native.welcome_end


@dataclass(init=False, slots=True)
class Welcome:
    """The end of a login: the bytes to send, and the tracked parameters the client starts
    with."""

    data: Final[bytes]
    params: Final[dict[str, str]]

    def __init__(self, data: bytes, params: dict[str, str]) -> None:
        self.data = data
        self.params = params


def build_welcome(
    server_params: Mapping[str, str],
    client_params: Mapping[str, str],
    tracked: Iterable[str],
    cancel_key: Key,
    reported: Mapping[tuple[str, str], str] | None = None,
) -> Welcome:
    """ParameterStatus for each parameter, BackendKeyData and ReadyForQuery: the welcome of
    every login, to a pool or to the admin console (NegotiateProtocolVersion came earlier,
    right after the StartupMessage).

    server_params: what the server side reports (a pool's first server, or the console's
    own); a tracked parameter the client set in its StartupMessage replaces its value, in the
    form PostgreSQL reports it: reported[(name, value)] when a server reported it already,
    else by proto/parameters.py's rules. BackendKeyData carries cancel_key (the one the
    client got at accept, proto/cancelkey.py).
    """
    statuses, params = _welcome_parts(server_params, client_params, tracked, reported)
    # (the key's two parts, not *cancel_key: compiled, a starred call is a generic one)
    return Welcome(WELCOME_END(statuses, cancel_key[0], cancel_key[1]), params)


def _welcome_parts(
    server_params: Mapping[str, str],
    client_params: Mapping[str, str],
    tracked: Iterable[str],
    reported: Mapping[tuple[str, str], str] | None,
) -> tuple[bytes, dict[str, str]]:
    """A welcome's ParameterStatus messages, and the tracked parameters of its client."""
    welcome = dict(server_params)
    params: dict[str, str] = {}
    for name in tracked:
        value = client_params.get(name)
        if value is not None:  # as PostgreSQL would report it (utf8 -> UTF8)
            known = None if reported is None else reported.get((name, value))
            value = known if known is not None else reported_form(name, value, server_params)
        else:
            value = welcome.get(name)
        if value is not None:
            params[name] = value
            welcome[name] = value
    return _parameter_statuses(tuple(welcome.items())), params


# A pool's clients mostly get the same parameters (its first server's, with the same few
# client settings): their ParameterStatus messages are built once, not at every login.
@lru_cache(maxsize=64)
def _parameter_statuses(params: tuple[tuple[str, str], ...]) -> bytes:
    return b"".join(build.parameter_status(name, value) for name, value in params)


#: At most this many pool welcomes are kept (WelcomeCache).
WELCOMES: Final = 256


class WelcomeCache:
    """The welcomes of a pool's clients by what they are made of: a pool's clients mostly
    send the same startup parameters, so the ParameterStatus part of their welcome and the
    parameters they start with are made once (build_welcome: about 20,000 instructions per
    login), not at every login; each still gets its own BackendKeyData.

    An entry is keyed by the server parameters' identity (a pool's welcome, made once and
    never written; the entry holds it, so that its id cannot be another's), the tracked
    names' identity (a configuration's tuple, the same at every login, held the same way:
    hashing it hashed every name), the client's tracked startup parameters and what
    `reported` says of them (it grows as servers report forms). share: what the parameters
    go through once (the runtime's sharing of equal parameter dicts), so that a hit returns
    the shared dict.
    """

    __slots__ = ("entries", "last_client", "last_entry", "last_forms")

    def __init__(self) -> None:
        self.entries: dict[
            tuple[int, int, tuple[tuple[str, str], ...], tuple[str | None, ...]],
            tuple[Mapping[str, str], tuple[str, ...], bytes, dict[str, str]],
        ] = {}
        #: The entry given last, and the client parameters and forms it was given for: most
        #: logins ask for the same as the one before, found then by comparing two dicts,
        #: not by making and hashing the tuple of a key.
        self.last_entry: tuple[Mapping[str, str], tuple[str, ...], bytes, dict[str, str]] | None
        self.last_entry = None
        self.last_client: dict[str, str] = {}
        self.last_forms: tuple[str | None, ...] = ()

    def welcome(
        self,
        server_params: Mapping[str, str],
        client_params: Mapping[str, str],
        tracked: tuple[str, ...],
        cancel_key: Key,
        reported: Mapping[tuple[str, str], str],
        share: Callable[[dict[str, str]], dict[str, str]],
    ) -> Welcome:
        """build_welcome's Welcome, its params already shared."""
        forms = tuple([reported.get(item) for item in client_params.items()]) if reported else ()
        last = self.last_entry
        if (
            last is not None
            and last[0] is server_params
            and last[1] is tracked
            and forms == self.last_forms
            and client_params == self.last_client
        ):
            return Welcome(WELCOME_END(last[2], cancel_key[0], cancel_key[1]), last[3])
        key = (id(server_params), id(tracked), tuple(client_params.items()), forms)
        entry = self.entries.get(key)
        if entry is None or entry[0] is not server_params or entry[1] is not tracked:
            statuses, params = _welcome_parts(server_params, client_params, tracked, reported)
            if len(self.entries) >= WELCOMES:  # many distinct sets: start again
                self.entries.clear()
            entry = self.entries[key] = (server_params, tracked, statuses, share(params))
        self.last_entry, self.last_client, self.last_forms = entry, dict(client_params), forms
        return Welcome(WELCOME_END(entry[2], cancel_key[0], cancel_key[1]), entry[3])
