def test_it_answers_the_bare_view(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_it_sends_anonymous_visitors_to_log_in(client, db):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].endswith("/accounts/login/")


def test_it_renders_the_layout_for_a_logged_in_owner(owner):
    response = owner.browser_client().get("/clusters/")
    assert response.status_code == 200
    assert b"Create cluster" in response.content


def test_it_refuses_the_api_without_a_key(client, db):
    response = client.get("/api/v1/openapi.json")
    assert response.status_code == 200
