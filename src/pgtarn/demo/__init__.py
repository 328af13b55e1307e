"""`pgtarn demo`: a throwaway PostgreSQL cluster with pgtarn, as a child process, in front of it."""

from .command import run_demo

__all__ = ["run_demo"]
