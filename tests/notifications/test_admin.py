"""The admin shows endpoints and their deliveries with each attempt, never the signing secret."""

import pytest
from django.test import Client

from accounts.models import User
from notifications.models import Attempt, Delivery, Endpoint


@pytest.fixture
def staff(db) -> Client:
    admin = User.objects.create_superuser(email="staff@example.com", password="x-long-password")
    client = Client()
    client.force_login(admin)
    return client


def test_it_renders_the_notifications_admin_pages_without_the_secret(staff, owner):
    endpoint = Endpoint.objects.create(
        project=owner.project, url="https://127.0.0.1/h", events=["cluster.ready"]
    )
    sent = Delivery.objects.create(endpoint=endpoint, event_type="ping", body={"type": "ping"})
    Attempt.objects.create(delivery=sent, status_code=503, error="answered 503")

    pages = [
        "/admin/notifications/endpoint/",
        f"/admin/notifications/endpoint/{endpoint.pk}/change/",
        "/admin/notifications/delivery/",
        f"/admin/notifications/delivery/{sent.pk}/change/",
    ]

    for page in pages:
        response = staff.get(page)
        assert response.status_code == 200, page
        assert endpoint.secret not in response.content.decode(), page
    assert "answered 503" in staff.get(pages[3]).content.decode()


def test_staff_cannot_add_an_endpoint_around_the_url_check(staff):
    assert staff.get("/admin/notifications/endpoint/add/").status_code == 403
