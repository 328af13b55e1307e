"""pgtarn: a PostgreSQL connection pooler."""

__version__ = "0.1.0"
#: The PgBouncer version pgtarn answers as: tools (exporters, scripts) match its string.
COMPATIBLE_VERSION = "1.25.2"
