"""One small client of the Runcrate API, used by the CLI and the MCP server alike.

Every failure becomes one exception, `ApiError`, with the API's own `code` and `message` (its
error envelope, SPEC §8) and the HTTP status; a server that cannot be reached or answers
something that is not the API becomes an `ApiError` too, with a sentence naming the URL. A GET
is retried twice on a transport failure; a POST never is: repeating a create could reserve
machines twice.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import httpx

from runcrate_cli import config

TIMEOUT = httpx.Timeout(30.0, connect=10.0)
GET_RETRY_DELAYS = (0.5, 1.0)
PAGE_SIZE = 200  # the largest page the list endpoints give
# A cluster is settled once nothing more happens to it without someone acting: running (the
# API's `running`, which the server decides), or ended.
ENDED = frozenset({"failed", "terminated", "stopped"})
DEFAULT_POLL_SECONDS = 2.0  # the reconciler's tick (RUNCRATE_TICK_SECONDS)
# A lost API is asked again after the poll interval, then twice as long each time, up to this.
MAX_BACKOFF_SECONDS = 30.0
# Answers that say the server is not there right now (a proxy in front of one restarting, the
# API's own outage answer), not that it refused: a wait tries again.
TRANSIENT_STATUSES = frozenset({502, 503, 504})
UNREACHABLE = frozenset({"unreachable", "timeout"})  # the codes of an answer that never came


class ApiError(Exception):
    """A refusal of the API, or no API at all: `code` and `message` as the API gave them,
    `status` its HTTP status (None when no answer came)."""

    def __init__(self, code: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "status": self.status}

    @property
    def transient(self) -> bool:
        """No answer came (the server is unreachable or too slow), or the answer says it is not
        there right now: asking again later may succeed."""
        return self.code in UNREACHABLE or self.status in TRANSIENT_STATUSES


def is_joining(cluster: dict, machine: dict) -> bool:
    """Whether `machine` is still joining a running cluster: starting, or installing its
    software as an added worker or a replacement. The server decides it (`joining`, from
    `clusters.lifecycle.rules.joining`); the CLI only reads it."""
    return bool(machine.get("joining"))


def is_settled(cluster: dict) -> bool:
    """Nothing more happens to the cluster without someone acting: it ended, or it runs (ready
    or degraded) with no machine still joining. A ready cluster whose added workers start is
    not settled yet: its hostfile lists only the machines that joined; nor is a degraded one
    whose replacement installs its software: it is ready again once that is done."""
    if not cluster["running"]:
        return cluster["status"] in ENDED
    return not any(is_joining(cluster, machine) for machine in cluster.get("machines") or [])


def utilization_summary(series: list[dict], *, index: int | None = None) -> dict[str, Any]:
    """The lowest, mean (weighted by each point's samples) and highest GPU utilisation of a
    node's metrics series (`GET …/metrics`), of one GPU or of them all, and the samples they
    sum up; None for a figure no point had."""
    spans = [
        (p["utilization_percent"], p["samples"])
        for p in series
        if index is None or p["index"] == index
    ]
    weighted = [(span["mean"], samples) for span, samples in spans if span["mean"] is not None]
    samples = sum(weight for _, weight in weighted)
    return {
        "min": min((s["min"] for s, _ in spans if s["min"] is not None), default=None),
        "mean": sum(m * w for m, w in weighted) / samples if samples else None,
        "max": max((s["max"] for s, _ in spans if s["max"] is not None), default=None),
        "samples": samples,
    }


def poll_seconds() -> float:
    raw = os.environ.get("RUNCRATE_POLL_SECONDS", "")
    try:
        return max(0.05, float(raw)) if raw else DEFAULT_POLL_SECONDS
    except ValueError:
        return DEFAULT_POLL_SECONDS


class ApiClient:
    def __init__(
        self,
        *,
        api_url: str,
        api_key: str | None,
        timeout: httpx.Timeout = TIMEOUT,
        transport: httpx.BaseTransport | None = None,
        user_agent: str = "runcrate-cli/1",
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.api_key = api_key
        self._http = httpx.Client(
            base_url=f"{self.api_url}/api/v1",
            timeout=timeout,
            transport=transport,
            headers={"user-agent": user_agent, "accept": "application/json"},
        )

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # --- one request ---------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """The decoded body of a 2xx answer (None for 204), or `ApiError`."""
        if not self.api_key:
            raise ApiError(
                "no_api_key",
                "No API key: run `runcrate login`, or set RUNCRATE_API_KEY.",
            )
        headers = {**(headers or {}), "authorization": f"Bearer {self.api_key}"}
        delays = GET_RETRY_DELAYS if method == "GET" else ()
        for attempt in range(len(delays) + 1):
            try:
                response = self._http.request(
                    method, path, params=params, json=json, headers=headers
                )
                break
            except httpx.TimeoutException:
                if attempt < len(delays):
                    time.sleep(delays[attempt])
                    continue
                raise ApiError(
                    "timeout",
                    f"The Runcrate API at {self.api_url} did not answer in time ({method} {path}).",
                ) from None
            except httpx.TransportError as error:
                if attempt < len(delays):
                    time.sleep(delays[attempt])
                    continue
                raise ApiError(
                    "unreachable",
                    f"Cannot reach the Runcrate API at {self.api_url} ({_reason(error)}). Is "
                    "the server running there? Set RUNCRATE_API_URL or run "
                    "`runcrate login --url URL`.",
                ) from None
        return self._decode(response, method, path)

    def _decode(self, response: httpx.Response, method: str, path: str) -> Any:
        if response.status_code == 204:
            return None
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.is_success:
            if not isinstance(body, dict):
                raise ApiError(
                    "not_the_api",
                    f"{self.api_url} answered {method} /api/v1{path} with something that is "
                    "not the Runcrate API's JSON: check the URL.",
                    response.status_code,
                )
            return body
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict) and "code" in error and "message" in error:
            raise ApiError(str(error["code"]), str(error["message"]), response.status_code)
        raise ApiError(
            f"http_{response.status_code}",
            f"{self.api_url} answered {method} /api/v1{path} with HTTP {response.status_code} "
            f"{response.reason_phrase} and no API error: check the URL, or try again later.",
            response.status_code,
        )

    def data(self, method: str, path: str, **kwargs: Any) -> Any:
        body = self.request(method, path, **kwargs)
        return None if body is None else body["data"]

    def pages(self, path: str, params: dict[str, Any] | None = None) -> Iterator[dict]:
        """Every object of a paginated list (`data` + `meta.total`)."""
        offset = 0
        while True:
            body = self.request(
                "GET", path, params={**(params or {}), "limit": PAGE_SIZE, "offset": offset}
            )
            yield from body["data"]
            offset += len(body["data"])
            if not body["data"] or offset >= body["meta"]["total"]:
                return

    # --- the catalog ------------------------------------------------------------------------

    def me(self) -> dict:
        return self.data("GET", "/me")

    def gpus(self, *, include_community: bool = False) -> list[dict]:
        return self.data("GET", "/gpus", params={"include_community": include_community})

    def offers(self, *, gpu: str, nodes: int, include_community: bool = False) -> list[dict]:
        params = {"gpu": gpu, "nodes": nodes, "include_community": include_community}
        return self.data("GET", "/offers", params=params)

    # --- clusters -----------------------------------------------------------------------------

    def clusters(self) -> list[dict]:
        return list(self.pages("/clusters"))

    def cluster(self, cluster_id: int) -> dict:
        return self.data("GET", f"/clusters/{cluster_id}")

    @staticmethod
    def cluster_body(
        *,
        offer_id: str,
        nodes: int,
        name: str,
        software: str = "none",
        ssh_key_ids: list[int] | None = None,
        volume_id: int | None = None,
        environment: str | None = None,
        repair_policy: str | None = None,
    ) -> dict[str, Any]:
        """The body of a create, which the plan takes too (POST /clusters/plan)."""
        body: dict[str, Any] = {
            "offer_id": offer_id,
            "nodes": nodes,
            "name": name,
            "software": software,
        }
        if ssh_key_ids:
            body["ssh_key_ids"] = ssh_key_ids
        if volume_id is not None:
            body["volume_id"] = volume_id
        if environment:
            body["environment"] = environment
        if repair_policy is not None:
            body["repair_policy"] = repair_policy
        return body

    def plan_cluster(self, body: dict[str, Any]) -> dict:
        """What creating `body` would do, decided by the server with every check the create
        runs, reserving nothing: the plan (prices, GPUs, hours the balance covers, time to
        ready, a `plan_token` valid 10 minutes) or the create's own refusal as an ApiError."""
        return self.data("POST", "/clusters/plan", json=body)

    def create_cluster(
        self,
        *,
        offer_id: str,
        nodes: int,
        name: str,
        software: str = "none",
        ssh_key_ids: list[int] | None = None,
        volume_id: int | None = None,
        environment: str | None = None,
        repair_policy: str | None = None,
        idempotency_key: str | None = None,
        plan_token: str | None = None,
    ) -> dict:
        """Create a cluster. With `idempotency_key`, sending the same create again answers the
        first one's cluster and reserves nothing twice (the API keeps the key 24 hours). With
        `plan_token` (from `plan_cluster`), the server refuses a body other than the one
        planned (`plan_mismatch`) or a plan older than 10 minutes (`plan_expired`)."""
        payload = self.cluster_body(
            offer_id=offer_id,
            nodes=nodes,
            name=name,
            software=software,
            ssh_key_ids=ssh_key_ids,
            volume_id=volume_id,
            environment=environment,
            repair_policy=repair_policy,
        )
        if plan_token is not None:
            payload["plan_token"] = plan_token
        headers = {"idempotency-key": idempotency_key} if idempotency_key else None
        return self.data("POST", "/clusters", json=payload, headers=headers)

    def terminate(self, cluster_id: int) -> dict:
        return self.data("POST", f"/clusters/{cluster_id}/terminate")

    def retry_install(self, cluster_id: int) -> dict:
        return self.data("POST", f"/clusters/{cluster_id}/retry-install")

    def plan_add_workers(self, cluster_id: int, *, count: int) -> dict:
        """What adding `count` machines would cost, decided by the server with every check the
        add runs, reserving nothing: the plan (the machines added per hour, the cluster's price
        now and after, a `plan_token` valid 10 minutes) or the add's own refusal as an
        ApiError."""
        return self.data("POST", f"/clusters/{cluster_id}/workers/plan", json={"count": count})

    def add_workers(self, cluster_id: int, *, count: int, plan_token: str | None = None) -> dict:
        """Add `count` machines; the cluster as it is then. With `plan_token` (from
        `plan_add_workers`), the server refuses another count or cluster (`plan_mismatch`) or a
        plan older than 10 minutes (`plan_expired`)."""
        body: dict[str, Any] = {"count": count}
        if plan_token is not None:
            body["plan_token"] = plan_token
        return self.data("POST", f"/clusters/{cluster_id}/workers", json=body)

    def plan_replace(self, cluster_id: int, node: str) -> dict:
        """What replacing the lost or unhealthy worker `node` would do, decided by the server
        with every check the replacement runs, reserving nothing: the plan (why, the private
        address kept, the prices, the billing in words, a `plan_token` valid 10 minutes) or the
        replacement's own refusal as an ApiError."""
        return self.data("POST", f"{self._node_path(cluster_id, node)}/replace/plan")

    def replace_node(self, cluster_id: int, node: str, *, plan_token: str | None = None) -> dict:
        """Replace `node` in place; the cluster as it is then. With `plan_token` (from
        `plan_replace`), the server refuses it for another machine (`plan_mismatch`) or after
        10 minutes (`plan_expired`)."""
        body = {"plan_token": plan_token} if plan_token is not None else {}
        return self.data("POST", f"{self._node_path(cluster_id, node)}/replace", json=body)

    def set_repair_policy(self, cluster_id: int, policy: str) -> dict:
        """Change who decides a replacement (`ask` or `auto`); the cluster as it is then."""
        return self.data("PATCH", f"/clusters/{cluster_id}", json={"repair_policy": policy})

    @staticmethod
    def _node_path(cluster_id: int, node: str) -> str:
        return f"/clusters/{cluster_id}/nodes/{quote(node, safe='')}"

    def network_test(self, cluster_id: int) -> dict:
        return self.data("POST", f"/clusters/{cluster_id}/network-test")

    def metrics(self, cluster_id: int, *, window: str = "15m") -> dict:
        return self.data("GET", f"/clusters/{cluster_id}/metrics", params={"window": window})

    def connect(self, cluster_id: int) -> dict:
        return self.data("GET", f"/clusters/{cluster_id}/connect")

    def resolve_cluster(self, ref: str | int) -> int:
        """A cluster's id from its id or its name. A name is looked up in the list: of the
        clusters with that name, the one still live (names are unique among live clusters of
        an environment), else the newest that ended."""
        text = str(ref).strip()
        if text.isdigit():
            return int(text)
        named = [c for c in self.clusters() if c["name"] == text]
        live = [c for c in named if c["status"] not in ("failed", "terminated", "stopped")]
        if len(live) > 1:
            ids = ", ".join(f"{c['id']} ({c['environment']})" for c in live)
            raise ApiError(
                "ambiguous_cluster",
                f"Several live clusters are named {text!r}: {ids}. Give the id instead.",
            )
        if live or named:
            return (live or named)[0]["id"]  # the list is newest first
        raise ApiError("not_found", f"There is no cluster named {text!r} in your project.", 404)

    def wait_for_cluster(
        self,
        cluster_id: int,
        *,
        timeout: float,
        on_update: Callable[[dict], None] | None = None,
        on_lost: Callable[[ApiError | None], None] | None = None,
        poll: float | None = None,
    ) -> tuple[dict, bool]:
        """Poll the cluster until it is settled (`is_settled`) or `timeout` seconds pass; return
        its last state and whether it settled. See `poll_until` for a lost API."""

        def settled(cluster: dict) -> bool:
            if on_update is not None:
                on_update(cluster)
            return is_settled(cluster)

        return self.poll_until(
            lambda: self.cluster(cluster_id), settled, timeout=timeout, on_lost=on_lost, poll=poll
        )

    def poll_until(
        self,
        read: Callable[[], dict],
        done: Callable[[dict], bool],
        *,
        timeout: float,
        on_lost: Callable[[ApiError | None], None] | None = None,
        poll: float | None = None,
    ) -> tuple[dict, bool]:
        """Call `read` every poll interval until `done(answer)` or `timeout` seconds pass;
        return the last answer and whether it was done.

        A wait outlives the API's blips: a read that cannot reach the server (a network
        failure, a server restarting, a proxy's 502/503/504) is tried again with a growing
        delay for as long as the wait's own limit, `on_lost(error)` told once when the API is
        lost and `on_lost(None)` once it answers again. Past the limit without an answer the
        last error is raised; any other refusal is raised at once."""
        interval = poll_seconds() if poll is None else poll
        deadline = time.monotonic() + timeout
        last: dict | None = None
        backoff = interval
        lost = False
        while True:
            try:
                answer = read()
            except ApiError as error:
                left = deadline - time.monotonic()
                if not error.transient or left <= 0:
                    raise
                if not lost and on_lost is not None:
                    on_lost(error)
                lost = True
                time.sleep(min(backoff, left))
                backoff = min(backoff * 2, max(interval, MAX_BACKOFF_SECONDS))
                continue
            if lost and on_lost is not None:
                on_lost(None)
            lost, backoff, last = False, interval, answer
            if done(answer):
                return answer, True
            left = deadline - time.monotonic()
            if left <= 0:
                return last, False
            time.sleep(min(interval, left))

    # --- SSH keys and volumes -------------------------------------------------------------------

    def ssh_keys(self) -> list[dict]:
        return list(self.pages("/ssh-keys"))

    def resolve_ssh_keys(self, refs: list[str]) -> list[int]:
        """SSH keys' ids from their ids, names or fingerprints."""
        if all(ref.strip().isdigit() for ref in refs):
            return [int(ref) for ref in refs]
        keys = self.ssh_keys()
        ids = []
        for ref in refs:
            match = [k for k in keys if ref.strip() in (str(k["id"]), k["name"], k["fingerprint"])]
            if not match:
                raise ApiError("not_found", f"Your project has no SSH key {ref!r}.", 404)
            ids.append(match[0]["id"])
        return ids

    def volumes(self) -> list[dict]:
        return list(self.pages("/volumes"))

    def resolve_volume(self, ref: str | int) -> int:
        text = str(ref).strip()
        if text.isdigit():
            return int(text)
        for volume in self.volumes():
            if volume["name"] == text:
                return volume["id"]
        raise ApiError("not_found", f"There is no volume named {text!r} in your project.", 404)

    def create_volume(self, *, name: str, location: str, size_gb: int) -> dict:
        payload = {"name": name, "location": location, "size_gb": size_gb}
        return self.data("POST", "/volumes", json=payload)

    def delete_volume(self, volume_id: int) -> None:
        self.request("DELETE", f"/volumes/{volume_id}")

    # --- billing and quotes -------------------------------------------------------------------

    def balance(self, *, price_per_hour: str | None = None) -> dict:
        """The balance; with `price_per_hour`, also what creating a cluster at that price needs
        (`balance_needed`: the server's rule, never restated here)."""
        params = {"price_per_hour": price_per_hour} if price_per_hour is not None else None
        return self.data("GET", "/billing/balance", params=params)

    def usage(self, *, month: str | None = None) -> dict:
        """The month's usage: its clusters (`data`) and totals (`meta`), every page."""
        params = {"month": month} if month else {}
        first = self.request("GET", "/billing/usage", params={**params, "limit": 1000})
        lines = list(first["data"])
        while len(lines) < first["meta"]["total"]:
            page = self.request(
                "GET", "/billing/usage", params={**params, "limit": 1000, "offset": len(lines)}
            )
            if not page["data"]:
                break
            lines += page["data"]
        return {"data": lines, "meta": first["meta"]}

    def quotes(self) -> list[dict]:
        return self.data("GET", "/quotes")

    def quote(self, quote_id: int) -> dict:
        return self.data("GET", f"/quotes/{quote_id}")

    def request_quote(self, **fields: Any) -> dict:
        return self.data("POST", "/quotes", json=fields)


def _reason(error: httpx.TransportError) -> str:
    text = str(error) or type(error).__name__
    return "connection refused" if "refused" in text.lower() else text


def configured_client() -> ApiClient:
    """The client of the saved configuration (`runcrate login`, or RUNCRATE_API_URL and
    RUNCRATE_API_KEY): what every command that calls the API talks through."""
    settings = config.load()
    return ApiClient(api_url=settings.api_url, api_key=settings.api_key)
