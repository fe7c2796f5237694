"""Single-server membership changes (Raft dissertation 4.1) as pure functions on ConfState.

One node is added or removed per change, so any two consecutive configurations share a majority
and no joint consensus is needed. A change takes effect on each node as soon as it is in that
node's log (not when committed); the leader allows one uncommitted change at a time.
"""

from __future__ import annotations

from raft_store.types import ConfChange, ConfChangeType, ConfState


class MembershipError(ValueError):
    """A change that cannot be applied to the current configuration."""


def apply_change(conf: ConfState, data: bytes) -> ConfState:
    change = ConfChange.decode(data)
    if change.change == ConfChangeType.ADD_VOTER:
        return ConfState(voters=conf.voters | {change.node}, learners=conf.learners - {change.node})
    if change.change == ConfChangeType.ADD_LEARNER:
        if change.node in conf.voters:
            # Demoting a voter is a removal plus an add; refuse the ambiguous form.
            return conf
        return ConfState(voters=conf.voters, learners=conf.learners | {change.node})
    return ConfState(voters=conf.voters - {change.node}, learners=conf.learners - {change.node})


def validate_change(conf: ConfState, change: ConfChange) -> None:
    """Refuse changes that would leave no voters or that are no-ops, before they are proposed."""
    if change.node <= 0:
        raise MembershipError("node ids are positive")
    if change.change == ConfChangeType.ADD_VOTER and change.node in conf.voters:
        raise MembershipError(f"node {change.node} is already a voter")
    if change.change == ConfChangeType.ADD_LEARNER and change.node in conf.all_nodes():
        raise MembershipError(f"node {change.node} is already a member")
    if change.change == ConfChangeType.REMOVE_NODE:
        if change.node not in conf.all_nodes():
            raise MembershipError(f"node {change.node} is not a member")
        if conf.voters == {change.node}:
            raise MembershipError("cannot remove the last voter")
