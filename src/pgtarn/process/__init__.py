"""The pgtarn process around its pools: start, signals, shutdown, and the supervisor of workers."""
