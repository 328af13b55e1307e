"""Every setting and section key the parser reads has a description, and no stale one."""

from __future__ import annotations

import pytest

from pgtarn.config import inifile as configfile
from pgtarn.config.settings import SETTINGS
from pgtarn.descriptions import DATABASE_KEYS, PEER_KEYS, USER_KEYS
from pgtarn.descriptions import SETTINGS as DOCS


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_every_setting_has_a_description(name: str) -> None:
    doc = DOCS.get(name)
    assert doc is not None, f"{name}: add a SettingDoc in src/pgtarn/descriptions/"
    assert doc.section and doc.text.strip()


def test_no_description_of_a_setting_that_does_not_exist() -> None:
    assert sorted(set(DOCS) - set(SETTINGS)) == []


def test_pgtarn_settings_state_no_difference_from_pgbouncer() -> None:
    # "differs" is how PgBouncer's setting of the same name behaves; pgtarn's own have none
    assert [n for n, s in SETTINGS.items() if s.pgtarn_only and DOCS[n].differs] == []


def test_settings_pgtarn_reads_without_acting_on_are_settings() -> None:
    assert sorted(set(configfile.NOT_APPLIED) - set(SETTINGS)) == []
    # their page says what PgBouncer does with them and why pgtarn does not: no "differs"
    assert [n for n in configfile.NOT_APPLIED if DOCS[n].differs] == []


# The parser's key sets are private to configfile: read here, never changed.
@pytest.mark.parametrize(
    ("section", "parsed", "described"),
    [
        ("databases", configfile._DB_KEYS, DATABASE_KEYS),
        ("users", configfile._USER_KEYS, USER_KEYS),
        ("peers", configfile._PEER_KEYS, PEER_KEYS),
    ],
)
def test_every_section_key_has_a_description(
    section: str, parsed: frozenset[str], described: dict[str, object]
) -> None:
    assert sorted(parsed - set(described)) == [], f"[{section}] keys without a KeyDoc"
    assert sorted(set(described) - parsed) == [], f"[{section}] KeyDocs of no key"
