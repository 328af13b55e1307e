"""Sans-IO PostgreSQL wire protocol: framing, message decoding and encoding."""
