#!/usr/bin/env python3
"""The Runcrate cluster agent: one stdlib-only file copied to every node (DESIGN.md).

It checks in with the node's token, reporting its GPUs as nvidia-smi sees them (step
`agent`); tests reaching every peer over the private network and reports the result (step
`network`); then heartbeats. Configuration comes from the environment, or from
/etc/runcrate/agent.json with the same keys in lowercase:

    RUNCRATE_URL         e.g. https://clusters.runcrate.example (the dashboard)
    RUNCRATE_NODE_ID     this node's id
    RUNCRATE_NODE_TOKEN  this node's token (never logged)

Usage: runcrate_agent.py [--once]
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

CONFIG_FILE = Path("/etc/runcrate/agent.json")
NVIDIA_SMI = [
    "nvidia-smi",
    "--query-gpu=name,memory.total,uuid,driver_version",
    "--format=csv,noheader,nounits",
]
PROBE_PORT = 22  # every node runs sshd on its private address
PROBE_TIMEOUT = 3.0
HEARTBEAT_SECONDS = 30
RETRY_SECONDS = 5


def load_config(environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = dict(os.environ if environ is None else environ)
    config: dict[str, str] = {}
    if CONFIG_FILE.exists():
        config.update({k.upper(): str(v) for k, v in json.loads(CONFIG_FILE.read_text()).items()})
    for key in ("RUNCRATE_URL", "RUNCRATE_NODE_ID", "RUNCRATE_NODE_TOKEN"):
        if environ.get(key):
            config[key] = environ[key]
        if not config.get(key):
            raise SystemExit(f"runcrate-agent: {key} is not set (environment or {CONFIG_FILE}).")
    return config


def read_gpus() -> str:
    """nvidia-smi's CSV; empty on a machine without it (the server then sees 0 GPUs)."""
    try:
        done = subprocess.run(  # noqa: S603 (a fixed command line, no input in it)
            NVIDIA_SMI, capture_output=True, text=True, timeout=60, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout


def probe(address: str, port: int = PROBE_PORT, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether a TCP connection to address:port opens within `timeout`."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


class Agent:
    def __init__(self, url: str, node_id: str, token: str, *, port: int = PROBE_PORT) -> None:
        if not url.startswith(("https://", "http://")):
            raise SystemExit(f"runcrate-agent: RUNCRATE_URL must be an http(s) URL, not {url!r}.")
        self.base = f"{url.rstrip('/')}/api/v1/agent/nodes/{node_id}"
        self.token = token
        self.port = port

    def _post(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(  # noqa: S310 (the scheme is checked in __init__)
            f"{self.base}/{path}",
            data=json.dumps(body).encode(),
            method="POST",
            headers={
                "Authorization": f"Bearer {self.token}",
                "Content-Type": "application/json",
                "User-Agent": "runcrate-agent/1",
            },
        )
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            return json.loads(response.read())["data"]

    def check_in(self) -> dict:
        return self._post("check-in", {"nvidia_smi": read_gpus()})

    def test_network(self, peers: dict[str, str]) -> dict:
        reachability = {name: probe(ip, self.port) for name, ip in sorted(peers.items())}
        return self._post("network", {"reachability": reachability})

    def run_once(self) -> dict:
        state = self.check_in()
        if state["status"] == "starting" and state["step"] in ("network", "agent"):
            state = self.test_network(state["peers"])
        return state


def main(argv: list[str]) -> int:
    config = load_config()
    agent = Agent(config["RUNCRATE_URL"], config["RUNCRATE_NODE_ID"], config["RUNCRATE_NODE_TOKEN"])
    while True:
        try:
            state = agent.run_once()
        except urllib.error.HTTPError as error:
            if error.code in (403, 404, 410):  # wrong token, or this node was released
                print(f"runcrate-agent: stopping ({error.code})", file=sys.stderr)
                return 1
            time.sleep(RETRY_SECONDS)
            continue
        except (urllib.error.URLError, OSError) as error:
            print(f"runcrate-agent: {error}; retrying", file=sys.stderr)
            time.sleep(RETRY_SECONDS)
            continue
        if "--once" in argv:
            return 0
        # Until the node has joined, report again soon: peers may still be checking in.
        time.sleep(HEARTBEAT_SECONDS if state["status"] == "joined" else RETRY_SECONDS)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
