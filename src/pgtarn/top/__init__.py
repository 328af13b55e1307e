"""`pgtarn top`."""
