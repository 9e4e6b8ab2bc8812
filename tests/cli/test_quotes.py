"""`runcrate quote …`: a request reaches the quotes API and reads back as it gives it."""

import pytest

from offers.models import QuoteRequest
from tests.cli.kit import run_cli
from tests.factories import GpuModelFactory

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_requests_lists_and_shows_a_quote(env, tmp_path, account):
    GpuModelFactory(slug="h100-sxm")

    requested = run_cli(
        "quote", "request", "--gpu", "h100-sxm", "--nodes", "128", "--interconnect",
        "infiniband", "--start-date", "2026-05-01", "--weeks", "12", "--contact-name", "Ada",
        "--contact-email", "ada@example.com", "--notes", "NCCL all-reduce heavy",
        env=env, tmp_path=tmp_path,
    )  # fmt: skip

    assert requested.code == 0, requested.stderr
    quote = QuoteRequest.objects.get(project=account.project)
    assert (quote.nodes, quote.interconnect, quote.duration_weeks) == (128, "infiniband", 12)
    listed = run_cli("quote", "list", env=env, tmp_path=tmp_path)
    shown = run_cli("quote", "show", str(quote.pk), env=env, tmp_path=tmp_path)
    assert listed.json() == account.api_data("/quotes")
    assert shown.json() == requested.json() == account.api_data(f"/quotes/{quote.pk}")


def test_a_bad_start_date_is_a_usage_error_before_any_request(env, tmp_path, account):
    result = run_cli(
        "quote", "request", "--gpu", "h100-sxm", "--nodes", "128", "--start-date", "May 1",
        "--weeks", "12", "--contact-name", "Ada", "--contact-email", "ada@example.com",
        env=env, tmp_path=tmp_path,
    )  # fmt: skip

    assert result.code == 2
    assert "YYYY-MM-DD" in result.stderr
    assert not QuoteRequest.objects.exists()
