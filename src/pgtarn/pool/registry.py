"""(database, user) -> Pool, the limits that span pools, and applying a reloaded Config."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic

from ..config import Config, DatabaseEntry
from .pool import Pool, S


class Registry(Generic[S]):
    """All pools of the running pooler."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.pools: dict[tuple[str, str], Pool[S]] = {}
        self.launch: Callable[[Pool[S], DatabaseEntry], S] | None = None
        self.databases: dict[str, DatabaseEntry] = {}

    def __iter__(self) -> Iterator[Pool[S]]:
        return iter(list(self.pools.values()))

    def get_pool(self, db: DatabaseEntry, client_user: str) -> Pool[S]:
        """The pool for a database entry and a client; a forced user shares one pool."""
        server_user = db.user or client_user
        key = (db.name, server_user)
        pool = self.pools.get(key)
        if pool is None:
            pool = Pool(
                db.name,
                server_user,
                pool_size=self.config.pool_size_for(db, server_user),
                pool_mode=self.config.pool_mode_for(db, server_user),
                min_pool_size=(
                    db.min_pool_size if db.min_pool_size is not None
                    else self.config.min_pool_size
                ),
            )
            pool.connstr = db.connstr
            if self.launch is not None:
                pool.launch = self._launcher(db)
            pool.may_open = self.may_open
            self.pools[key] = pool
        self.databases[db.name] = db
        return pool

    def _launcher(self, first: DatabaseEntry) -> Callable[[Pool[S]], S]:
        launch = self.launch
        assert launch is not None

        def launch_current(pool: Pool[S]) -> S:
            # The entry may have changed by a reload since the pool was made.
            return launch(pool, self.databases.get(pool.database, first))

        return launch_current

    def may_open(self, pool: Pool[S]) -> bool:
        """max_db_connections / max_user_connections across pools."""
        db = self.databases.get(pool.database)
        max_db = (
            db.max_db_connections
            if db is not None and db.max_db_connections is not None
            else self.config.max_db_connections
        )
        if max_db and self._count(lambda p: p.database == pool.database) >= max_db:
            return False
        user_entry = self.config.users.get(pool.user)
        max_user = (
            user_entry.max_user_connections
            if user_entry is not None and user_entry.max_user_connections is not None
            else self.config.max_user_connections
        )
        return not (max_user and self._count(lambda p: p.user == pool.user) >= max_user)

    def _count(self, match: Callable[[Pool[S]], bool]) -> int:
        return sum(p.server_count for p in self.pools.values() if match(p))

    def apply(self, config: Config) -> None:
        """Take a reloaded config: sizes and modes now, changed connection strings on release."""
        self.config = config
        for pool in self.pools.values():
            db = config.find_database(pool.database)
            if db is None:
                continue
            pool.pool_size = config.pool_size_for(db, pool.user)
            pool.pool_mode = config.pool_mode_for(db, pool.user)
            if db.connstr != pool.connstr:
                pool.connstr = db.connstr
                pool.close_idle("connection string changed")
            self.databases[db.name] = db
