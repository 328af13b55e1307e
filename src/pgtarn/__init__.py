"""pgtarn: a PostgreSQL connection pooler."""

__version__ = "0.1.0"
