"""The policy webhook makes the pod webhooks' conditions cover a policy while the API server admits
it, before the leader's watch brings it: pods created right after the policy (one apply of a policy
and its workload) reach the webhooks. A superset is always safe; nothing here ever refuses a policy."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import fiar_contract as contract
from fiar_operator.admission.review import Admission, Review
from fiar_operator.core.errors import ApiError
from fiar_operator.core.metrics import Metrics
from fiar_operator.core.policy import Policy, parse_policy
from fiar_operator.reconcile import webhookconfig
from fiar_operator.reconcile.webhooksync import ADMITTED_FOR, MAX_ADMITTED, WebhookSync, static_conditions
from fiar_operator.state import kube
from fiar_operator.state.store import Store

CONFIG = "fiar-operator"


class RecordingKube(kube.Kube):
    """Records each patch of the webhook configuration; ``fail`` makes the next ones fail."""

    def __init__(self) -> None:
        self.patches: list[dict[str, str]] = []
        self.fail = False

    def call(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: Any = 10.0,
    ) -> Any:
        assert (method, path) == ("PATCH", f"{kube.MUTATING_CONFIGS}/{CONFIG}")
        if self.fail:
            raise ApiError("the API server is away")
        self.patches.append({w["name"]: w["matchConditions"][0]["expression"] for w in body["webhooks"]})
        return {}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def policy(name: str, namespace: str, generation: int = 0) -> Policy:
    obj = {
        "kind": contract.KIND,
        "metadata": {"name": name, "generation": generation},
        "spec": {
            "podSelector": {"matchLabels": {"app": "vllm"}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        },
    }
    return parse_policy(obj)


def synced(leader_policies: list[Policy]) -> tuple[WebhookSync, RecordingKube, Clock]:
    client, clock = RecordingKube(), Clock()
    sync = WebhookSync(client, CONFIG)
    sync.clock = clock
    assert sync.sync(leader_policies, [])
    return sync, client, clock


def pod_condition(policies: list[Policy]) -> str:
    return webhookconfig.pod_condition(policies)


def test_the_leader_narrows_the_conditions_to_a_policy_being_admitted() -> None:
    old, new = policy("old", "ml"), policy("new", "team-a")
    sync, client, _ = synced([old])
    assert sync.admit(new, [old], [], leading=True) == "narrowed"
    assert client.patches[-1][webhookconfig.POD_HOOK] == pod_condition([old, new])
    assert "team-a" in client.patches[-1][webhookconfig.BINDING_HOOK]


def test_the_leaders_own_sync_keeps_an_admitted_policy_its_watch_has_not_brought() -> None:
    old, new = policy("old", "ml"), policy("new", "team-a")
    sync, client, clock = synced([old])
    sync.admit(new, [old], [], leading=True)
    patches = len(client.patches)
    clock.now += ADMITTED_FOR - 1
    assert not sync.due()
    assert not sync.sync([old], [])  # an unrelated change: the admitted policy still counts
    assert len(client.patches) == patches


def test_an_admitted_policy_never_stored_stops_counting_after_a_while() -> None:
    old, new = policy("old", "ml"), policy("new", "team-a")
    sync, client, clock = synced([old])
    sync.admit(new, [old], [], leading=True)
    clock.now += ADMITTED_FOR + 0.1
    assert sync.due()
    assert sync.sync([old], [])
    assert client.patches[-1][webhookconfig.POD_HOOK] == pod_condition([old])
    assert not sync.due()


def test_once_the_watch_brings_the_admitted_policy_nothing_more_is_patched() -> None:
    old, new = policy("old", "ml"), policy("new", "team-a")
    sync, client, clock = synced([old])
    sync.admit(new, [old], [], leading=True)
    patches = len(client.patches)
    stored = policy("new", "team-a", generation=1)  # the same spec as stored: a generation of its own
    assert not sync.sync([old, stored], [])
    clock.now += ADMITTED_FOR + 0.1
    assert not sync.sync([old, stored], [])
    assert len(client.patches) == patches


def test_a_changed_policy_counts_beside_its_old_version_until_the_watch_brings_the_change() -> None:
    before, after = policy("p", "ml"), policy("p", "team-b")
    sync, client, _ = synced([before])
    assert sync.admit(after, [before], [], leading=True) == "narrowed"
    expression = client.patches[-1][webhookconfig.POD_HOOK]
    assert '"ml"' in expression and '"team-b"' in expression


def test_another_replica_widens_to_the_static_conditions_only_for_a_policy_not_covered() -> None:
    old, new = policy("old", "ml"), policy("new", "team-a")
    client = RecordingKube()
    follower = WebhookSync(client, CONFIG)
    assert follower.admit(new, [old], [], leading=False) == "widened"
    static = {hook: conditions[0]["expression"] for hook, conditions in static_conditions().items()}
    assert client.patches == [static]
    renamed_field = dataclasses.replace(old, priority=5)  # the same selectors: already covered
    assert follower.admit(renamed_field, [old], [], leading=False) == "covered"
    assert client.patches == [static]


def test_a_failed_patch_is_logged_and_the_policy_still_admitted() -> None:
    old, new = policy("old", "ml"), policy("new", "team-a")
    client = RecordingKube()
    follower = WebhookSync(client, CONFIG)
    client.fail = True
    assert follower.admit(new, [old], [], leading=False) == "not widened"


def test_forged_reviews_change_the_conditions_a_bounded_number_of_times() -> None:
    """The webhook port is unauthenticated: a flood of policy reviews, each a new policy, makes at
    most ``MAX_ADMITTED`` patches and holds at most that many clauses per ``ADMITTED_FOR`` seconds."""
    sync, client, clock = synced([])
    results = [sync.admit(policy(f"forged-{i}", f"ns-{i}"), [], [], leading=True) for i in range(1000)]
    assert results.count("narrowed") == MAX_ADMITTED
    assert len(client.patches) == 1 + MAX_ADMITTED
    assert results[-1].startswith("not widened")
    clock.now += ADMITTED_FOR + 0.1
    assert sync.admit(policy("real", "ml"), [], [], leading=True) == "narrowed"
    assert client.patches[-1][webhookconfig.POD_HOOK] == pod_condition([policy("real", "ml")])


def test_without_a_configuration_to_follow_nothing_is_patched() -> None:
    client = RecordingKube()
    assert WebhookSync(client, None).admit(policy("p", "ml"), [], [], leading=True).startswith("no configuration")
    assert client.patches == []


# -- the webhook itself ---------------------------------------------------------------------------
def review(operation: str, obj: Any, dry_run: bool = False) -> Review:
    request = {"uid": "r-1", "operation": operation, "object": obj, "dryRun": dry_run}
    return Review("admission.k8s.io/v1", request)


def policy_object(name: str = "p", spec: Any = None) -> dict[str, Any]:
    return {
        "kind": contract.KIND,
        "metadata": {"name": name},
        "spec": spec if spec is not None else {"podSelector": {"matchLabels": {"app": "vllm"}}},
    }


def admission() -> tuple[Admission, list[Policy]]:
    seen: list[Policy] = []
    store = Store()
    return Admission(store, Metrics(store.sizes, store.index_bytes), on_policy=seen.append), seen


def test_a_policy_created_or_changed_is_handed_over_and_allowed() -> None:
    webhook, seen = admission()
    for operation in ("CREATE", "UPDATE"):
        answer = webhook.policy(review(operation, policy_object()))
        assert answer["response"] == {"uid": "r-1", "allowed": True}
    assert [p.name for p in seen] == ["p", "p"]


def test_a_dry_run_has_no_side_effect() -> None:
    webhook, seen = admission()
    assert webhook.policy(review("CREATE", policy_object(), dry_run=True))["response"]["allowed"] is True
    assert seen == []


def test_a_policy_fiar_cannot_use_or_not_a_policy_is_allowed_without_a_side_effect() -> None:
    webhook, seen = admission()
    for obj in (policy_object(spec={}), {"kind": "Pod"}, "text", None):
        assert webhook.policy(review("CREATE", obj))["response"]["allowed"] is True
    assert webhook.policy(review("DELETE", policy_object()))["response"]["allowed"] is True
    assert seen == []
