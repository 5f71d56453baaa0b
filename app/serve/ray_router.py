"""Which replica a user's request goes to under ``serve --ray``: the one holding their lease.

Ray Serve's own multiplexed routing prefers a replica that reported the user loaded, but that
report reaches the routers a little after the load (pushed every 0.1 s, then broadcast), and a
saturated replica's users spill to others. Either way a user's next request can land on a
replica that does not hold them; it would wait for their lease and answer 503. This router
(Ray Serve's request-router extension, run in the front's process) asks the lease itself:

* the replica named in the user's lease file (``lease.py``: the last holder writes its replica
  id there), if it is alive: it holds the user, or gave them up and takes them again at once;
* otherwise (a user new to the server, or a holder that died) the live replica that rendezvous
  hashing picks for the user id: the same one for every front while the replicas are the
  same, so two first requests of one user at once meet on one replica.

Only that replica is offered: a user's request waits for their replica's capacity rather than
going to one that cannot open their memory. Requests without a user (``/health``) go anywhere.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from app.serve.lease import Leases

HOLDER = re.compile(r"\breplica (\S+)")  # in a lease file: "<host> pid <pid> replica <id> ..."


def replica_holder(replica_id: str, host: str, pid: int) -> str:
    """A replica's name in the lease files it takes (:data:`HOLDER` finds the id in it)."""
    return f"{host} pid {pid} replica {replica_id}"


class LeaseRouter(RequestRouter):
    """Routes each user's requests to the replica that holds (or held) their lease."""

    def initialize_state(self, leases_folder: str = "", **kwargs: Any) -> None:
        self.leases = Leases(Path(leases_folder), "a router (reads only)")

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        user_id = pending_request.metadata.multiplexed_model_id if pending_request else ""
        if not user_id or not candidate_replicas:
            return [candidate_replicas]
        return [[self.replica_for(user_id, candidate_replicas)]]

    def replica_for(self, user_id: str, replicas: list[RunningReplica]) -> RunningReplica:
        by_id = {r.replica_id.unique_id: r for r in replicas}
        named = HOLDER.search(self.leases.holder(user_id) or "")
        if named is not None and named.group(1) in by_id:
            return by_id[named.group(1)]
        return max(replicas, key=lambda r: _weight(user_id, r.replica_id.unique_id))


def _weight(user_id: str, replica_id: str) -> bytes:
    """Rendezvous hashing: each (user, replica) pair's weight; the heaviest replica wins."""
    return hashlib.sha256(f"{user_id}\0{replica_id}".encode()).digest()
