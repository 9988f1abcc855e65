"""The access tables (`tokens`, `user list`, `audit`) and `whoami` read as every other
table: columns aligned however long a value is, times as the other views show them."""

from __future__ import annotations

from trainyard.cli_access import render_audit, render_tokens, render_users, render_whoami


def _columns_start_where_the_header_says(text: str) -> None:
    header, *rows = text.splitlines()
    starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
    for row in rows:
        for start in starts[1:]:
            assert row[start - 1] == " " and row[start] != " ", (header, row)


def test_tokens_align_under_their_header_with_times_as_other_tables_show_them() -> None:
    tokens = [
        {
            "id": 1,
            "name": "default",
            "user": "admin",
            "expires_at": "2027-03-06T14:23:40.684359Z",
            "revoked_at": None,
        },
        {
            "id": 12,
            "name": "a-token-name-longer-than-sixteen",
            "user": "someone-with-a-long-user-name",
            "expires_at": None,
            "revoked_at": "2026-12-06T14:00:00Z",
        },
    ]
    text = render_tokens(tokens)
    _columns_start_where_the_header_says(text)
    assert "2027-03-06 14:23:40Z" in text and "T14:23" not in text
    assert text.splitlines()[2].split()[-2:] == ["never", "revoked"]


def test_users_and_audit_align_however_long_a_value_is() -> None:
    users = [
        {"name": "a" * 30, "role": "operator", "disabled_at": None},
        {"name": "b", "role": "member", "disabled_at": "2026-12-06T14:00:00Z"},
    ]
    _columns_start_where_the_header_says(render_users(users))
    entries = [
        {
            "id": 7,
            "at": "2026-12-06T14:23:40.684359+00:00",
            "actor": "ml-research/a-very-long-actor-name-x",
            "action": "token.create",
            "target": "token 3",
        }
    ]
    text = render_audit(entries)
    _columns_start_where_the_header_says(text)
    assert "2026-12-06 14:23:40Z" in text


def test_whoami_shows_the_expiry_as_the_tables_do() -> None:
    me = {
        "user": "admin",
        "team": "ml-research",
        "role": "admin",
        "token_id": 1,
        "token_name": "default",
        "expires_at": "2027-03-06T14:23:40.684359Z",
    }
    assert render_whoami(me).endswith("expires 2027-03-06 14:23:40Z")
    assert render_whoami({**me, "expires_at": None}).endswith("never expires")
