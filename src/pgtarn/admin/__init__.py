"""The admin console: PgBouncer's SHOW and control commands on the virtual database."""
