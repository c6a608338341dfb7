"""Beyond Kubernetes-style preemption: an urgent whole-node gang on a pool whose
every node mixes urgent and preemptible work. No node can be freed by preemption alone, so
Kubernetes-style preemption finds no candidate node and the gang waits as long as with no
preemption at all, while a stream of small urgent jobs keeps taking whatever frees up.
xirang drains the node whose urgent work ends soonest (nothing new that would outlast the
wait starts there) and preempts the rest of it as soon as that work ends."""

from sim_helpers import job, workload

from replay.sim import Cluster, simulate

HOUR_S = 3600


def _mixed_pool_with_an_urgent_gang():
    jobs = [
        # Each node: a preemptible 7-GPU job and a small urgent job (node a's ends first).
        job("batch-a", 0, 10 * HOUR_S, gpus=7, level=6, team="batch"),
        job("batch-b", 0, 10 * HOUR_S, gpus=7, level=6, team="batch"),
        job("urgent-a", 1, 1 * HOUR_S, level=1, team="ops"),
        job("urgent-b", 1, 3 * HOUR_S, level=1, team="ops"),
        job("gang", 600, 1 * HOUR_S, gpus=8, level=1, team="train"),
    ]
    # Then a stream of small urgent jobs, one every 20 min for 9 h, 3 h each: each keeps
    # the node it lands on mixed.
    jobs += [job(f"stream-{i}", 900 + i * 1200, 3 * HOUR_S, level=1, team="ops") for i in range(27)]
    return workload(*jobs)


def _gang_wait_h(policy: str) -> float:
    result = simulate(_mixed_pool_with_an_urgent_gang(), Cluster.uniform(16, 8), policy)
    gang = next(j for j in result.jobs if j.id == "gang")
    assert gang.first_start_ms >= 0, f"{policy}: the gang never started"
    return (gang.first_start_ms - gang.submit_ms) / 3_600_000


def test_an_urgent_gang_gets_a_drained_node_where_kubernetes_style_waits_like_no_preemption():
    xirang, k8s, none = _gang_wait_h("xirang"), _gang_wait_h("k8s"), _gang_wait_h("none")
    # xirang: node a's urgent job ends after 1 h (50 min after the gang arrives); then a few
    # seconds for the batch jobs there to let go.
    assert xirang < 1.0
    # Kubernetes-style: no node can be freed, the stream keeps every node mixed; the gang
    # waits about as long as with no preemption.
    assert k8s > 3 * xirang
    assert k8s > 0.5 * none
