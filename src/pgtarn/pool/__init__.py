"""Pool accounting: who gets which server; never touches sockets."""
