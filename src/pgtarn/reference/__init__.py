"""The reference pages of the documentation, generated from the code they describe.

Each page is a function returning Markdown; ``python -m pgtarn.reference`` writes them under
docs/reference/ (or checks that the files there are up to date, for CI).
"""
