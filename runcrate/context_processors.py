from django.http import HttpRequest

# Views whose page belongs to another section of the navigation than their URL's namespace:
# the New cluster form (clusters:new) is the create flow's second step, after the offers.
SECTION_OF_VIEW = {"clusters:new": "offers"}


def navigation(request: HttpRequest) -> dict[str, str]:
    """The navigation's current section: the URL's namespace, or the view's own section."""
    match = getattr(request, "resolver_match", None)
    if match is None:
        return {"nav_section": ""}
    return {"nav_section": SECTION_OF_VIEW.get(match.view_name, match.namespace)}
