"""How far a wait says a cluster is (mcp_server.progress): machines up out of the size and the
step of the machine furthest behind. The network test's verdict is the server's:
tests/clusters/test_network_test_verdict.py."""

from runcrate_cli.mcp_server import progress


def machines(*steps):
    return [
        {"name": f"node-{i}", "step": step, "status": "joined" if step == "done" else "starting"}
        for i, step in enumerate(steps)
    ]


def test_progress_counts_steps_in_machines_and_names_the_step_furthest_behind():
    starting = {"status": "provisioning", "nodes": 2, "machines": machines("running", "agent")}
    halfway = {"status": "installing", "nodes": 2, "machines": machines("done", "network")}
    ready = {"status": "ready", "nodes": 2, "machines": machines("done", "done")}

    assert progress(starting) == (0.25, 2, "provisioning: 0 of 2 machines up, step running")
    assert progress(halfway) == (1.5, 2, "installing: 1 of 2 machines up, step network")
    assert progress(ready) == (2.0, 2, "ready: 2 of 2 machines up")
