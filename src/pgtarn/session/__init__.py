"""What transaction pooling must carry from one server to the next for a client."""
