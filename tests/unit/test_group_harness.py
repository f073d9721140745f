"""The group harness itself (tests/support/group_harness.py) forms a group the way the other tests rely on."""
from __future__ import annotations

from coordinator.group.state import GroupState
from tests.support.group_harness import Env, env, form_group  # noqa: F401  (env: the fixture)


async def test_harness_forms_a_stable_group(env: Env) -> None:
    a, b = env.client("a"), env.client("b")
    await form_group(env, a, b)
    assert env.state() is GroupState.STABLE
    assert a.generation == b.generation == 1
    assert a.sync_task.result().assignment == b"assignment-a"
