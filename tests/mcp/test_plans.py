"""The plan's confirmation token: bound to every planned parameter and to the caller's key,
signed with the server process's own secret, and short-lived."""

import pytest

from runcrate_cli.mcp_server import PLAN_TTL_SECONDS, PlanRefused, Plans, plan_fields

NOW = 1_800_000_000


def fields(**changes):
    planned = {
        "key": "rc_live_agent",
        "offer_id": "use2-h100x8-vm",
        "nodes": 4,
        "name": "train",
        "software": "slurm",
        "volume_id": None,
        "environment": "default",
    }
    return plan_fields(**{**planned, **changes})


def refusal(plans: Plans, token: str, planned: dict, now: float) -> str:
    with pytest.raises(PlanRefused) as raised:
        plans.check(token, planned, now=now)
    return raised.value.code


def test_it_accepts_its_own_token_for_the_same_plan_until_it_expires():
    plans = Plans()
    token, expires = plans.issue(fields(), now=NOW)

    plans.check(token, fields(), now=NOW + PLAN_TTL_SECONDS)  # the last second: still good

    assert expires == NOW + PLAN_TTL_SECONDS
    assert refusal(plans, token, fields(), NOW + PLAN_TTL_SECONDS + 1) == "confirmation_expired"


@pytest.mark.parametrize(
    "change",
    [
        {"offer_id": "use2-h100x8-bm"},
        {"nodes": 8},
        {"name": "other"},
        {"software": "none"},
        {"volume_id": 3},
        {"environment": "prod"},
        {"key": "rc_live_someone_else"},
    ],
)
def test_it_refuses_the_token_for_any_other_parameter(change):
    plans = Plans()
    token, _ = plans.issue(fields(), now=NOW)

    assert refusal(plans, token, fields(**change), NOW) == "confirmation_mismatch"


def test_another_server_process_does_not_accept_the_token():
    token, _ = Plans().issue(fields(), now=NOW)

    assert refusal(Plans(), token, fields(), NOW) == "confirmation_mismatch"


def test_a_later_expiry_cannot_be_written_into_a_token():
    plans = Plans()
    token, expires = plans.issue(fields(), now=NOW)
    signature = token.partition(".")[2]

    assert refusal(plans, f"{expires + 3600}.{signature}", fields(), NOW) == (
        "confirmation_mismatch"
    )


@pytest.mark.parametrize("token", ["", "abc", "123.", ".abc", "123.abc"])
def test_a_missing_or_malformed_token_asks_for_a_plan(token):
    assert refusal(Plans(), token, fields(), NOW) == "confirmation_required"


def test_the_token_binds_a_digest_of_the_key_never_the_key():
    assert "rc_live_agent" not in str(fields())


def _variants(token: str) -> dict[str, str]:
    """The same token written another way: each would once have passed the check."""
    expires, _, signature = token.partition(".")
    full_width = "".join(chr(ord(digit) - ord("0") + ord("０")) for digit in expires)
    return {
        "a leading zero": f"0{token}",
        "two leading zeros": f"00{token}",
        "full-width digits": f"{full_width}.{signature}",
        "an uppercase signature": f"{expires}.{signature.upper()}",
        "spaces around it": f" {token} ",
        "a trailing newline": f"{token}\n",
        "a plus sign": f"+{token}",
    }


@pytest.mark.parametrize(
    "variant",
    [
        "a leading zero",
        "two leading zeros",
        "full-width digits",
        "an uppercase signature",
        "spaces around it",
        "a trailing newline",
        "a plus sign",
    ],
)
def test_only_the_token_itself_is_accepted_never_another_spelling_of_it(variant):
    plans = Plans()
    token, _ = plans.issue(fields(), now=NOW)
    plans.check(token, fields(), now=NOW)  # the token as issued

    assert refusal(plans, _variants(token)[variant], fields(), NOW) == "confirmation_required"


def test_the_token_is_one_form_ascii_digits_a_dot_and_lowercase_hex():
    token, expires = Plans().issue(fields(), now=NOW)

    assert token.isascii()
    assert token == f"{expires}.{token.partition('.')[2]}"
    assert len(token.partition(".")[2]) == 64
    assert token.partition(".")[2] == token.partition(".")[2].lower()
