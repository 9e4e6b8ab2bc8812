"""Our own 404 and 500 pages (issue 13, item 8), with DEBUG off as in production; the API keeps
its JSON envelope for both."""

import pytest
from django.test import Client

from tests.factories import ClusterFactory


@pytest.fixture(autouse=True)
def _production(settings):
    settings.DEBUG = False


def test_a_missing_page_renders_ours_with_404_and_the_navigation(owner):
    response = owner.browser_client().get("/no-such-page/")
    assert response.status_code == 404
    html = response.content.decode()
    assert '<h1 id="error-title">Nothing is here</h1>' in html
    assert "<code>/no-such-page/</code>" in html
    assert 'aria-label="Main"' in html  # base.html's navigation, so every page is a click away
    assert 'href="/clusters/"' in html
    assert [t.name for t in response.templates][:2] == ["404.html", "base.html"]


def test_another_projects_cluster_is_our_404_too(owner, stranger):
    cluster = ClusterFactory(project=stranger.project)
    response = owner.browser_client().get(f"/clusters/{cluster.pk}/")
    assert response.status_code == 404
    assert "Nothing is here" in response.content.decode()
    assert cluster.name not in response.content.decode()


def test_an_anonymous_visitor_gets_ours_with_a_log_in_link(db):
    response = Client().get("/nothing-here")
    assert response.status_code == 404
    html = response.content.decode()
    assert "Nothing is here" in html and 'href="/accounts/login/"' in html


def test_a_crash_renders_our_500_without_a_traceback(owner, monkeypatch):
    def boom(project):
        raise RuntimeError("a secret detail")

    monkeypatch.setattr("clusters.web.views.quotes_for", boom)
    client = owner.browser_client()
    client.raise_request_exception = False
    response = client.get("/clusters/")
    assert response.status_code == 500
    html = response.content.decode()
    assert "Something went wrong on our side" in html
    assert "a secret detail" not in html and "Traceback" not in html
    assert 'href="/static/css/app.css"' in html


def test_the_api_keeps_its_json_envelope(owner):
    response = owner.api().get("/api/v1/no-such-thing")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["error"]["code"] == "not_found"
