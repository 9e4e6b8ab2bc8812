"""The readiness checks read the real commands' output: `sinfo -h -N -o '%N|%T|%G'`,
`kubectl get nodes -o json`, `ray list nodes -f state=ALIVE --format json`."""

import json
from pathlib import Path

import pytest

from clusters.machines.base import CheckState
from clusters.machines.software import checks
from clusters.machines.software import simulated as outputs

EXPECTED = [
    checks.ExpectedNode("node-0", "10.77.0.1", 8),
    checks.ExpectedNode("node-1", "10.77.0.2", 8),
]


# --- Slurm ----------------------------------------------------------------------------------


def test_it_passes_slurm_when_every_node_is_exactly_idle_with_its_gpus():
    output = "node-0|idle|gpu:h100:8(S:0-1)\nnode-1|idle|gpu:8\n"
    result = checks.check_slurm(output, EXPECTED)
    assert result.state == CheckState.READY
    assert result.ready_nodes == {"node-0", "node-1"}
    assert result.output == output


@pytest.mark.parametrize(
    ("state", "why"),
    [
        ("idle*", "idle*"),  # not responding
        ("drained", "drained"),
        ("draining", "draining"),
        ("down*", "down*"),
        ("mixed", "mixed"),
        ("allocated", "allocated"),
    ],
)
def test_it_does_not_pass_slurm_nodes_that_are_not_idle(state, why):
    result = checks.check_slurm(f"node-0|idle|gpu:h100:8\nnode-1|{state}|gpu:h100:8\n", EXPECTED)
    assert result.state == CheckState.PENDING
    assert result.ready_nodes == {"node-0"}
    assert why in result.problems["node-1"]


def test_it_needs_every_partition_line_of_a_node_idle():
    output = "node-0|idle|gpu:h100:8\nnode-1|idle|gpu:h100:8\nnode-1|mixed|gpu:h100:8\n"
    result = checks.check_slurm(output, EXPECTED)
    assert result.problems == {"node-1": "state idle, mixed (needs idle)"}


def test_it_does_not_pass_slurm_with_missing_nodes_or_gpus():
    result = checks.check_slurm("node-0|idle|gpu:h100:4\n", EXPECTED)
    assert result.problems == {
        "node-0": "4 GPUs in gres (needs 8)",
        "node-1": "not listed by sinfo",
    }
    assert checks.check_slurm("node-0|idle|(null)\n", EXPECTED[:1]).state == CheckState.PENDING


def test_it_fails_slurm_output_it_cannot_read():
    # (A controller that does not answer yet is pending: see below.)
    result = checks.check_slurm("sinfo: error: Invalid node format specification\n", [])
    assert result.state == CheckState.FAILED
    assert "NODE|STATE|GRES" in result.problems["*"]


# --- Kubernetes -----------------------------------------------------------------------------


def kube_node(name, *, ready="True", unschedulable=False, taints=(), gpus="8"):
    spec = {"taints": list(taints)} if taints else {}
    if unschedulable:
        spec["unschedulable"] = True
    allocatable = {"cpu": "96", "memory": "1056757896Ki", "pods": "110"}
    if gpus is not None:
        allocatable["nvidia.com/gpu"] = gpus
    return {
        "metadata": {"name": name},
        "spec": spec,
        "status": {
            "allocatable": allocatable,
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": ready, "reason": "KubeletReady"},
            ],
        },
    }


def kubectl(*items):
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(items)})


def test_it_passes_kubernetes_nodes_ready_schedulable_with_their_gpus():
    output = kubectl(
        kube_node("node-0", taints=[{"key": "x", "effect": "PreferNoSchedule"}]),
        kube_node("node-1"),
    )
    assert checks.check_kubernetes(output, EXPECTED).state == CheckState.READY


@pytest.mark.parametrize(
    ("node", "why"),
    [
        (kube_node("node-1", ready="False"), "Ready is False"),
        (kube_node("node-1", ready="Unknown"), "Ready is Unknown"),
        (kube_node("node-1", unschedulable=True), "cordoned"),
        (
            kube_node("node-1", taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]),
            "tainted nvidia.com/gpu:NoSchedule",
        ),
        (
            kube_node("node-1", taints=[{"key": "k", "effect": "NoExecute"}]),
            "tainted k:NoExecute",
        ),
        (kube_node("node-1", gpus="4"), "allocatable is 4 (needs 8)"),
        (kube_node("node-1", gpus=None), "allocatable is None"),
    ],
)
def test_it_does_not_pass_kubernetes_nodes_that_cannot_take_gpu_work(node, why):
    result = checks.check_kubernetes(kubectl(kube_node("node-0"), node), EXPECTED)
    assert result.state == CheckState.PENDING
    assert why in result.problems["node-1"]
    assert "node-0" in result.ready_nodes


def test_it_does_not_pass_a_node_kubernetes_does_not_list():
    result = checks.check_kubernetes(kubectl(kube_node("node-0")), EXPECTED)
    assert result.problems == {"node-1": "not registered with the cluster"}


@pytest.mark.parametrize("output", ["", "The connection to the server was refused", "{}", "[]"])
def test_it_fails_kubectl_output_it_cannot_read(output):
    assert checks.check_kubernetes(output, EXPECTED).state == CheckState.FAILED


# --- Ray --------------------------------------------------------------------------------------


def ray_node(ip, *, gpus=8.0, state="ALIVE"):
    return {
        "node_id": f"id-{ip}",
        "node_ip": ip,
        "is_head_node": ip.endswith(".1"),
        "state": state,
        "node_name": ip,
        "resources_total": {"CPU": 96.0, "GPU": gpus, f"node:{ip}": 1.0},
    }


def test_it_passes_ray_when_every_address_is_alive_with_its_gpus():
    output = json.dumps([ray_node("10.77.0.1"), ray_node("10.77.0.2")])
    assert checks.check_ray(output, EXPECTED).state == CheckState.READY


def test_it_does_not_pass_ray_nodes_missing_dead_or_short_of_gpus():
    output = json.dumps([ray_node("10.77.0.1", gpus=4.0), ray_node("10.77.0.2", state="DEAD")])
    result = checks.check_ray(output, EXPECTED)
    assert result.problems == {
        "node-0": "Ray sees 4 GPUs (needs 8)",
        "node-1": "10.77.0.2 is not alive in Ray",
    }
    no_gpu = json.dumps([{**ray_node("10.77.0.1"), "resources_total": {"CPU": 8.0}}])
    assert "sees 0 GPUs" in checks.check_ray(no_gpu, EXPECTED[:1]).problems["node-0"]


@pytest.mark.parametrize("output", ["", "Ray is not running", '{"nodes": []}', "[1, 2]"])
def test_it_fails_ray_output_it_cannot_read(output):
    result = checks.check_ray(output, EXPECTED)
    if output == "[1, 2]":  # a list, but of no nodes: nothing alive yet
        assert result.state == CheckState.PENDING
    else:
        assert result.state == CheckState.FAILED


# --- the simulated data center prints what the parsers read ---------------------------------


@pytest.mark.parametrize("software", ["slurm", "kubernetes", "ray"])
def test_it_parses_the_simulated_outputs_like_real_ones(software):
    nodes = [
        outputs.SimNode("node-0", "10.77.0.1", 8, "h100-sxm", ready=True, is_head=True),
        outputs.SimNode("node-1", "10.77.0.2", 8, "h100-sxm", ready=False),
    ]
    settling = checks.run_check(software, outputs.OUTPUTS[software](nodes), EXPECTED)
    assert settling.state == CheckState.PENDING
    assert settling.ready_nodes == {"node-0"}

    nodes[1] = outputs.SimNode("node-1", "10.77.0.2", 8, "h100-sxm", ready=True)
    assert checks.run_check(software, outputs.OUTPUTS[software](nodes), EXPECTED).state == (
        CheckState.READY
    )


def test_a_slurm_controller_still_starting_is_pending_not_failed():
    # sinfo's stderr (exit 1) while slurmctld starts, as the check's output.
    output = "slurm_load_node: Unable to contact slurm controller (connect failure)\n"
    result = checks.check_slurm(output, EXPECTED)
    assert result.state == CheckState.PENDING
    assert result.ready_nodes == frozenset()
    assert checks.check_slurm(output, []).state == CheckState.PENDING
    assert set(result.problems.values()) == {"the Slurm controller does not answer yet"}


def test_ray_with_no_node_alive_yet_is_pending_not_failed():
    result = checks.check_ray("No resource in the cluster\n", EXPECTED)
    assert result.state == CheckState.PENDING
    assert set(result.problems.values()) == {"no node is alive in Ray yet"}
    # Anything else that is not Ray's JSON still fails: the check itself is broken.
    assert checks.check_ray("Traceback (most recent call last):", EXPECTED).state == (
        CheckState.FAILED
    )


# --- What real Ray 2.60 printed on a lab host (tests/clusters/data/ray/) ------------------------

RAY_OUTPUTS = Path(__file__).parent / "data" / "ray"


def real_ray(name: str) -> str:
    return (RAY_OUTPUTS / f"{name}.txt").read_text()


@pytest.mark.parametrize(
    ("name", "why"),
    [
        # Before `ray start --head` has written its address: a ConnectionError, exit 1.
        ("no-instance", "Ray is not running on the head yet"),
        # The head is up but its dashboard (the state API) does not answer: exit 2.
        ("dashboard-down", "Ray's dashboard is still starting"),
        # Running, and no node matches the filter (exit 0).
        ("dead-filter", "no node is alive in Ray yet"),
    ],
)
def test_real_ray_outputs_while_it_starts_are_pending_not_failed(name, why):
    result = checks.check_ray(real_ray(name), EXPECTED)
    assert result.state == CheckState.PENDING
    assert result.ready_nodes == frozenset()
    assert set(result.problems.values()) == {why}


def test_real_ray_json_is_read_by_address_with_its_gpus():
    # One head on 172.30.77.11 with `--num-gpus=2`, as `ray list nodes --format json` printed it.
    head = checks.ExpectedNode("node-0", "172.30.77.11", 2)
    assert checks.check_ray(real_ray("alive"), [head]).state == CheckState.READY
    worker = checks.ExpectedNode("node-1", "172.30.77.12", 2)
    result = checks.check_ray(real_ray("alive"), [head, worker])
    assert result.state == CheckState.PENDING
    assert result.ready_nodes == {"node-0"}
    assert result.problems == {"node-1": "172.30.77.12 is not alive in Ray"}
    short = checks.check_ray(real_ray("alive"), [checks.ExpectedNode("node-0", "172.30.77.11", 4)])
    assert short.problems == {"node-0": "Ray sees 2 GPUs (needs 4)"}


# --- kubectl get nodes -o json, shaped like k3s v1.32 prints it (tests/clusters/data/kubernetes/)
# Not captured from a running k3s (the lab cannot fetch the release): written from its format,
# with a server's control-plane labels, flannel's annotations and the kubelet's conditions.

KUBERNETES_OUTPUTS = Path(__file__).parent / "data" / "kubernetes"


def k3s_nodes(name: str) -> str:
    return (KUBERNETES_OUTPUTS / f"{name}.json").read_text()


def test_a_k3s_server_without_a_taint_takes_gpu_work_like_its_agent():
    output = k3s_nodes("k3s-ready")
    head = json.loads(output)["items"][0]
    assert head["metadata"]["labels"]["node-role.kubernetes.io/control-plane"] == "true"
    result = checks.check_kubernetes(output, EXPECTED)
    assert result.state == CheckState.READY
    assert result.ready_nodes == {"node-0", "node-1"}


def test_a_k3s_server_tainted_control_plane_no_schedule_is_not_ready():
    result = checks.check_kubernetes(k3s_nodes("k3s-control-plane-tainted"), EXPECTED)
    assert result.state == CheckState.PENDING
    assert result.ready_nodes == {"node-1"}
    assert result.problems == {"node-0": "tainted node-role.kubernetes.io/control-plane:NoSchedule"}


def test_a_k3s_agent_still_joining_is_pending_with_the_kubelets_word():
    result = checks.check_kubernetes(k3s_nodes("k3s-worker-joining"), EXPECTED)
    assert result.state == CheckState.PENDING
    assert result.ready_nodes == {"node-0"}
    assert result.problems == {"node-1": "Ready is False"}
