"""Sockets and TLS: what client and server connections share below the protocol."""
