"""SSH names that never collide (issue 21): from the user's computer every machine is reached by
a cluster-scoped name only, `NAME-node-i` (and `NAME` for the head), so two clusters' configs
included together each keep their own address, port, host key alias and jump. Checked with the
real OpenSSH client: `ssh -G` parses the configs and prints what it would use, sending nothing."""

import dataclasses
import re
import subprocess
from pathlib import Path

import pytest

from clusters.connect import ClusterShape, NodeAccess, details, ssh_config, ssh_names

GATEWAY = "gw.fra-1.runcrate.net:2222"

# One cluster reached directly at its machines' own addresses, one through the location's
# gateway; both have a node-0 and a node-1, as every cluster does.
DIRECT = ClusterShape(
    cluster_id=42,
    name="train",
    nodes=(
        NodeAccess(index=0, address="203.0.113.10"),
        NodeAccess(index=1, address="203.0.113.11", port=2201),
        NodeAccess(index=2, address="203.0.113.12"),
    ),
    gpus_per_node=8,
    machine_kind="vm",
    software="none",
    gateway=None,
)
BEHIND = ClusterShape(
    cluster_id=43,
    name="infer",
    nodes=(NodeAccess(index=0, address="10.0.3.17"), NodeAccess(index=1, address=None)),
    gpus_per_node=8,
    machine_kind="bare_metal",
    software="none",
    gateway=GATEWAY,
)


def resolve(config: Path, host: str) -> dict[str, str]:
    done = subprocess.run(
        ["ssh", "-G", "-F", str(config), host], capture_output=True, text=True, check=True
    )
    return dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)


@pytest.fixture
def both_included(tmp_path: Path) -> Path:
    """The two configs as the page says to save them (~/.ssh/config.d/NAME), both included
    from one main config, the direct cluster's first."""
    config_d = tmp_path / "config.d"
    config_d.mkdir()
    for shape in (DIRECT, BEHIND):
        (config_d / shape.name).write_text(ssh_config(shape))
    main = tmp_path / "config"
    main.write_text(f"Include {config_d}/train\nInclude {config_d}/infer\n")
    return main


def expected(shape: ClusterShape, node: NodeAccess) -> dict[str, str | None]:
    return {
        "hostname": node.address or node.name,
        "port": str(node.port),
        "user": "root",
        "hostkeyalias": f"runcrate-c{shape.cluster_id}-{node.name}",
        "proxyjump": f"c{shape.cluster_id}@{GATEWAY}" if shape.gateway else None,
    }


def test_it_resolves_every_name_of_two_included_clusters_to_its_own_machine(both_included):
    names = {
        "train": (DIRECT, DIRECT.nodes[0]),
        "train-node-0": (DIRECT, DIRECT.nodes[0]),
        "train-node-1": (DIRECT, DIRECT.nodes[1]),
        "train-node-2": (DIRECT, DIRECT.nodes[2]),
        "infer": (BEHIND, BEHIND.nodes[0]),
        "infer-node-0": (BEHIND, BEHIND.nodes[0]),
        "infer-node-1": (BEHIND, BEHIND.nodes[1]),
    }
    for name, (shape, node) in names.items():
        got = resolve(both_included, name)
        want = expected(shape, node)
        assert {key: got.get(key) for key in want} == want, name


def test_it_leaves_a_bare_node_name_to_ssh_itself(both_included):
    # The old configs both declared `Host node-0`: ssh took HostName from the first and
    # ProxyJump from the second. Now neither declares it, so nothing of theirs applies.
    for bare in ("node-0", "node-1", "node-2"):
        got = resolve(both_included, bare)
        assert got["hostname"] == bare
        assert "hostkeyalias" not in got and "proxyjump" not in got


SHAPES = (
    DIRECT,
    BEHIND,
    # sixteen containers behind the gateway, none with an address yet
    dataclasses.replace(
        BEHIND,
        nodes=tuple(NodeAccess(index=i, address=None) for i in range(16)),
        machine_kind="container",
    ),
    # a worker with no route yet (no address, no gateway): a comment, not an entry
    dataclasses.replace(
        DIRECT, nodes=(DIRECT.nodes[0], NodeAccess(index=1, address=None)), software="slurm"
    ),
    # one machine; and a cluster that has none up yet
    dataclasses.replace(DIRECT, nodes=DIRECT.nodes[:1]),
    dataclasses.replace(DIRECT, nodes=()),
    # clusters named like a node, or like another cluster's node
    dataclasses.replace(DIRECT, name="node-1"),
    dataclasses.replace(DIRECT, name="train-node-1", cluster_id=44),
)


def declared(config: str) -> list[str]:
    return [
        name
        for line in config.splitlines()
        if line.startswith("Host ")
        for name in line.split()[1:]
    ]


def test_no_config_declares_a_bare_node_name():
    for shape in SHAPES:
        config = ssh_config(shape)
        names = declared(config)
        assert not [name for name in names if re.fullmatch(r"node-[0-9]+", name)], shape.name
        if not shape.name.startswith("node-"):
            assert "Host node-" not in config
        assert all(name == shape.name or name.startswith(f"{shape.name}-node-") for name in names)
        assert len(names) == len(set(names))


def test_the_head_answers_to_the_clusters_name_unless_it_is_a_node_name():
    assert declared(ssh_config(DIRECT))[:2] == ["train", "train-node-0"]
    # `node-1` alone would be a bare node name; `train-node-1` is train's worker.
    assert declared(ssh_config(SHAPES[-2])) == [f"node-1-node-{i}" for i in range(3)]
    named_like_a_worker = SHAPES[-1]
    assert declared(ssh_config(named_like_a_worker))[0] == "train-node-1-node-0"
    everyone = declared(ssh_config(DIRECT)) + declared(ssh_config(named_like_a_worker))
    assert len(everyone) == len(set(everyone))


def test_the_api_the_cli_and_the_email_name_the_machines_as_the_config_does():
    connect = details(DIRECT)
    assert [row["hosts"] for row in connect["ssh"]] == [
        ["train", "train-node-0"],
        ["train-node-1"],
        ["train-node-2"],
    ]
    assert [row["node"] for row in connect["ssh"]] == ["node-0", "node-1", "node-2"]
    assert (
        connect["ssh_names"]
        == ssh_names(DIRECT)
        == (
            "Then ssh train (or ssh train-node-0) reaches node-0, the head, and ssh train-node-1 "
            "… ssh train-node-2 the other nodes."
        )
    )
    assert f"# {ssh_names(DIRECT)}\n" in connect["ssh_config"]
    assert ssh_names(dataclasses.replace(DIRECT, nodes=DIRECT.nodes[:1])) == (
        "Then ssh train (or ssh train-node-0) reaches node-0, the head."
    )
    # Inside the cluster the machines keep their names: the hostfile, MASTER_ADDR.
    assert connect["hostfile"]["content"].startswith("node-0 slots=8\n")
    assert connect["environment"][1]["variables"]["MASTER_ADDR"] == "node-0"
