"""Rolling restart (--reboot): a new pgtarn takes over the sockets and clients of the old."""
