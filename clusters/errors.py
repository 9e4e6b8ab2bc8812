from runcrate.errors import Refused


class ClusterRefused(Refused):
    """A cluster request refused with a stable code and a sentence for a person.

    Raised by the service functions in `clusters/lifecycle.py` before anything is reserved or
    changed; the API maps it to `{"error": {"code", "message"}}` (status from `STATUS`), the
    pages show `message` beside `field` (or at the top when there is none).
    """

    STATUS = {
        "invalid_nodes": 422,
        "unknown_offer": 404,
        "insufficient_balance": 402,
        "budget_reached": 402,
        "not_enough_machines": 409,
        "software_not_offered": 422,
        "invalid_name": 422,
        "name_taken": 409,
        "no_ssh_keys": 422,
        "unknown_ssh_key": 422,
        "unknown_member": 422,
        "unknown_environment": 404,
        "invalid_state": 409,
        "invalid_count": 422,
        "volume_not_allowed": 422,
        "volume_in_use": 409,
        "network_test_running": 409,
        "key_limit_exceeded": 403,
        "unknown_quote": 404,
        "quote_not_won": 409,
        "invalid_price": 422,
        "plan_mismatch": 422,
        "plan_expired": 422,
        "unknown_node": 404,
        "invalid_repair_policy": 422,
        "head_not_replaceable": 409,
        "replacement_in_progress": 409,
        "node_not_replaceable": 409,
    }
