"""What the layers below client/ and server/ know of a connection: its state and its views."""
