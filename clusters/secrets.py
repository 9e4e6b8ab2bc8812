"""A cluster's secrets, derived and stored nowhere: its agents' tokens, its kube token and CA,
its node-to-node key pair (docs/security.md, "Derived secrets").

Every one is an HMAC-SHA256 of a message naming what it is for, under one of the project's
keys (`SECRET_KEY`, then `SECRET_KEY_FALLBACKS`): `derive`. A value handed to a running
cluster must survive a key rotation (the new key becomes `SECRET_KEY`, the old one moves to
the fallbacks), so each is derived under the key the cluster, or the node, was started under:

- an agent's token under the key whose token matches the hash its node keeps
  (`Node.agent_token_hash`, written when the node is reserved); a node without one gets the
  current key's;
- a cluster-wide secret under the key its founding node's (node-0's) token was made with
  (`cluster_key`): node-0 is reserved with the cluster, so that is the key the cluster was
  created under, and every later worker, the kubeconfig and the node keys keep using it.

No key id is stored: the hash the node already keeps says which key it was.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import datetime
from typing import Protocol

from django.conf import settings

AGENT = "runcrate-agent"


class NodeTokenRow(Protocol):
    """What a node's agent token is derived from (a `clusters.models.Node` is one)."""

    cluster_id: int
    index: int
    reserved_at: datetime
    agent_token_hash: str


def keys() -> list[str]:
    """The keys a secret may have been derived under, the current one first."""
    return [settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS]


def derive(key: str, purpose: str, context: str) -> bytes:
    """The one derivation: 32 bytes from `key` for `purpose` (what the secret is) and `context`
    (whose it is: the cluster, the node)."""
    return hmac.new(key.encode(), f"{purpose}:{context}".encode(), hashlib.sha256).digest()


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _agent_context(node: NodeTokenRow) -> str:
    return f"{node.cluster_id}:{node.index}:{node.reserved_at.isoformat()}"


def _node_key(node: NodeTokenRow | None) -> str | None:
    """The key whose agent token for `node` matches the hash it keeps, or None."""
    if node is None or not node.agent_token_hash:
        return None
    kept = node.agent_token_hash
    context = _agent_context(node)
    # Not an authentication (both sides are ours, derived and stored): a plain comparison.
    for key in keys():
        if token_hash(derive(key, AGENT, context).hex()) == kept:
            return key
    return None


def agent_token(node: NodeTokenRow) -> str:
    """The node's agent credential: under the key that made the hash it keeps, so the token
    its agent already holds stays the one it is sent; the current key's for a new node."""
    key = _node_key(node) or settings.SECRET_KEY
    return derive(key, AGENT, _agent_context(node)).hex()


def cluster_key(founder: NodeTokenRow | None) -> str:
    """The key the cluster was created under: the one its founding node's (node-0's) agent
    token hash verifies with; the current key where there is none to verify."""
    return _node_key(founder) or settings.SECRET_KEY


def cluster_secret(key: str, purpose: str, context: str) -> bytes:
    """A cluster-wide secret for `purpose`, under `key` (`cluster_key`; "" for the current
    key): the same on every node and every call."""
    return derive(key or settings.SECRET_KEY, purpose, context)
