import re


def test_it_serves_the_api_docs_from_our_own_static_files(client, db):
    response = client.get("/api/v1/docs")

    assert response.status_code == 200
    # What the page loads (scripts, styles, icons), not the links of the frame it sits in.
    html = response.content.decode()
    assets = re.findall(r'<script[^>]* src="([^"]+)"', html) + re.findall(
        r'<link[^>]* href="([^"]+)"', html
    )
    assert any(asset.endswith("swagger-ui-bundle.js") for asset in assets)
    assert any(asset.endswith("swagger-ui.css") for asset in assets)
    assert [asset for asset in assets if not asset.startswith("/static/")] == []
    for asset in assets:
        assert client.get(asset).status_code == 200, asset


def test_it_shows_the_api_docs_in_the_dashboards_frame_in_the_readers_scheme(owner):
    html = owner.browser_client().get("/api/v1/docs").content.decode()

    assert '<nav class="nav nav-wide" aria-label="Main">' in html  # the way back
    assert '<a class="skip-link" href="#main">' in html
    assert '<div id="swagger-ui"' in html and "<h1>API docs</h1>" in html
    assert 'href="/api/v1/openapi.json"' in html
    # Swagger UI's own dark theme, turned on when the reader's system is dark.
    assert "/static/js/swagger-scheme.js" in html
    # Its markup mended for the accessibility rules (the browser sweep checks the result), and
    # the heading level between the page's h1 and its h3 tags.
    assert "/static/js/swagger-a11y.js" in html
    assert '<h2 class="visually-hidden">Endpoints</h2>' in html


def test_it_describes_the_api_in_openapi(client, db):
    schema = client.get("/api/v1/openapi.json").json()

    assert schema["info"]["title"] == "Runcrate Clusters API"
    assert "/api/v1/offers" in schema["paths"]


def _operations(schema: dict):
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            yield f"{method.upper()} {path}", operation


def _error_statuses(operation: dict) -> set[int]:
    return {
        int(status)
        for status, answer in operation["responses"].items()
        if answer.get("content", {}).get("application/json", {}).get("schema", {}).get("$ref")
        == "#/components/schemas/ErrorOut"
    }


def test_it_declares_every_status_an_operation_can_answer_as_the_envelope(client, db):
    schema = client.get("/api/v1/openapi.json").json()

    for name, operation in _operations(schema):
        errors = _error_statuses(operation)
        assert {422, 500} <= errors, name
        if not name.split()[1].startswith("/api/v1/agent/"):
            assert {401, 403} <= errors, name
        if "{" in name:
            assert 404 in errors, name
        if "requestBody" in operation:
            assert {400, 413} <= errors, name
    operations = dict(_operations(schema))
    assert 404 in _error_statuses(operations["GET /api/v1/offers"])  # unknown_gpu
    assert 429 in _error_statuses(operations["POST /api/v1/quotes"])  # rate_limited
    assert {403, 410} <= _error_statuses(operations["POST /api/v1/agent/nodes/{node_id}/network"])


def test_it_declares_the_real_limits_of_inputs(client, db):
    schema = client.get("/api/v1/openapi.json").json()
    components = schema["components"]["schemas"]
    operations = dict(_operations(schema))

    cluster = components["ClusterIn"]["properties"]
    assert (cluster["nodes"]["minimum"], cluster["nodes"]["maximum"]) == (2, 64)
    assert cluster["name"]["pattern"] == "^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$"
    volume = components["VolumeIn"]["properties"]
    assert (volume["size_gb"]["minimum"], volume["size_gb"]["maximum"]) == (1, 100_000)
    assert components["WorkersIn"]["properties"]["count"]["maximum"] == 62
    for name in ("GET /api/v1/clusters", "GET /api/v1/billing/transactions", "GET /api/v1/keys"):
        [offset] = [p for p in operations[name]["parameters"] if p["name"] == "offset"]
        assert (offset["schema"]["minimum"], offset["schema"]["maximum"]) == (0, 10**9), name
