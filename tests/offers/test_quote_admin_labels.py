"""The quote list's editable status in the admin is a select named for its row (axe's
select-name, docs/accessibility.md), and every admin page loads the product's admin styles."""

from django.utils import timezone

from offers.models import QuoteRequest
from tests.factories import GpuModelFactory, UserFactory


def test_it_names_each_rows_status_select_after_its_quote_request(client, owner):
    staff = UserFactory(email="staff@example.com", is_staff=True, is_superuser=True)
    for name in ("Ada", "Grace"):
        QuoteRequest.objects.create(
            project=owner.project,
            gpu=GpuModelFactory(),
            nodes=16,
            start_date=timezone.now().date(),
            duration_weeks=4,
            contact_name=name,
            contact_email=f"{name.lower()}@example.com",
        )
    client.force_login(staff)

    html = client.get("/admin/offers/quoterequest/").content.decode()

    assert 'aria-label="Status of Ada&#x27;s quote request"' in html
    assert 'aria-label="Status of Grace&#x27;s quote request"' in html
    assert "/static/css/admin.css" in html
