import re


def test_it_serves_the_api_docs_from_our_own_static_files(client, db):
    response = client.get("/api/v1/docs")

    assert response.status_code == 200
    assets = re.findall(r'(?:src|href)="([^"]+)"', response.content.decode())
    assert any(asset.endswith("swagger-ui-bundle.js") for asset in assets)
    assert [asset for asset in assets if not asset.startswith("/static/")] == []
    for asset in assets:
        assert client.get(asset).status_code == 200, asset


def test_it_describes_the_api_in_openapi(client, db):
    schema = client.get("/api/v1/openapi.json").json()

    assert schema["info"]["title"] == "Runcrate Clusters API"
    assert "/api/v1/offers" in schema["paths"]
