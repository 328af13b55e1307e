"""`user =` and -u: the process gives up root for that user once its sockets are bound."""

from __future__ import annotations

import encodings.idna  # noqa: F401  (loaded while root: see drop_privileges)
import logging
import os
import pwd

from ..errors import ConfigError

log = logging.getLogger("pgtarn")


def drop_privileges(user: str) -> None:
    """Become user (its uid, its group and its supplementary groups), as PgBouncer does after
    binding its ports: nothing when user is empty or is who we are already. Only root may
    become another user; anyone else asking to is an error, not a silent no-op.

    The user must be able to read pgtarn's installation: modules Python loads on first use
    (the resolver's idna codec, imported above, is one) are loaded from it afterwards."""
    if not user:
        return
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise ConfigError(f"user: no such user: {user!r}") from None
    if os.geteuid() == entry.pw_uid:
        return
    if os.geteuid() != 0:
        raise ConfigError(
            f"user = {user}: pgtarn runs as uid {os.geteuid()} and only root "
            "can become another user"
        )
    os.initgroups(entry.pw_name, entry.pw_gid)
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)
    log.info("running as %s (uid %d, gid %d)", entry.pw_name, entry.pw_uid, entry.pw_gid)
