"""What the audit log does not record, and why (docs/audit.md, "Exemptions"). The walk test
(tests/audit/test_walk.py) calls every state-changing route and API operation and expects one
entry from each that is not named here, so a new route is recorded or listed here with its
reason: there is no third way.

Apart from these, only answers that changed nothing by construction go unrecorded: a 405 (the
route does not take the method), a request with no actor (logged out, or a key that did not
authenticate; the login throttle keeps its own count of failed sign-ins).
"""

# Path prefixes of machines, not people.
EXEMPT_PREFIXES: dict[str, str] = {
    "/api/v1/agent/": "The nodes' agents check in and report metrics by node token every few "
    "seconds: machines, not people; what they change is the cluster's own event history.",
}

# Actions (URL names, or the API's operation ids) recorded elsewhere or changing nothing.
EXEMPT_ACTIONS: dict[str, str] = {
    "billing:stripe_webhook": "Stripe's signed calls, not a person's: each payment they settle "
    "is its own ledger row and Payment, the record of it.",
    "billing:dismiss_banner": "Hides the low-balance banner with a cookie in the user's own "
    "browser: nothing of the project changes.",
    "clusters_api_plan_cluster": "A dry run: answers what a create would reserve and cost, and "
    "changes nothing.",
}


def exemption(*, path: str, action: str) -> str | None:
    """Why a request to `path` resolved as `action` is not recorded, or None when it is."""
    for prefix, reason in EXEMPT_PREFIXES.items():
        if path.startswith(prefix):
            return reason
    return EXEMPT_ACTIONS.get(action)
