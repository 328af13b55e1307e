"""The configuration: the typed Config and its settings, read from PgBouncer's pgbouncer.ini."""
