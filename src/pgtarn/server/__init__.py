"""Connections to PostgreSQL: log in, relay replies, reset, cancel; auth_query lookups."""
