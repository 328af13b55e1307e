"""session/readonly.py's allow-lists against a live PostgreSQL's catalog: every allowed
function is immutable or stable in every form it has, every allowed operator name exists."""

from __future__ import annotations

import pytest

from pgtarn.session.readonly import _OPERATORS, ALLOWED_FUNCTIONS
from tests.support import TempCluster

pytestmark = pytest.mark.integration

#: Allowed names that are newer than some PostgreSQL the suite may run on (16, 17, 18).
NEWER = frozenset(
    (
        "any_value",
        "array_reverse",
        "array_sort",
        "casefold",
        "date_add",
        "date_subtract",
        "json_agg_strict",
        "json_object_agg_strict",
        "json_object_agg_unique",
        "json_object_agg_unique_strict",
        "jsonb_agg_strict",
        "jsonb_object_agg_strict",
        "jsonb_object_agg_unique",
        "jsonb_object_agg_unique_strict",
        "jsonb_populate_record_valid",
        "system_user",
        "to_regtypemod",
        "uuid_extract_timestamp",
        "uuid_extract_version",
        "xmltext",
    )
)


def _rows(cluster: TempCluster, sql: str) -> list[list[str]]:
    return [line.split("|") for line in cluster.psql(sql).splitlines() if line]


def test_every_allowed_function_only_reads(pg_cluster: TempCluster) -> None:
    names = ", ".join(f"'{name}'" for name in sorted(ALLOWED_FUNCTIONS))
    rows = _rows(
        pg_cluster,
        f"""
        SELECT p.proname, string_agg(DISTINCT p.provolatile::text, '')
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'pg_catalog' AND p.proname IN ({names})
        GROUP BY p.proname""",
    )
    volatile = [name for name, kinds in rows if kinds.strip("is")]
    assert volatile == []
    missing = ALLOWED_FUNCTIONS - {name for name, _ in rows} - NEWER
    assert missing == set()  # a typo, or a name that is no function (a keyword's node)


def test_every_allowed_operator_name_is_built_in(pg_cluster: TempCluster) -> None:
    names = set(
        pg_cluster.psql("SELECT string_agg(DISTINCT oprname, ' ') FROM pg_operator").split()
    )  # one line: "|" is psql's separator and an operator's name
    spelled_otherwise = {
        "!=",
        "BETWEEN",
        "NOT BETWEEN",
        "BETWEEN SYMMETRIC",
        "NOT BETWEEN SYMMETRIC",
    }
    assert _OPERATORS - spelled_otherwise <= names
