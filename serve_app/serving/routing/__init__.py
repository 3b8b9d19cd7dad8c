"""Token-aware request routing (:class:`TokenLoadRouter`, Serve's ``RequestRouter`` API): the router, its cost
estimates, its ledger of what it sent each replica, the replicas' reports, its indexes of the prompt blocks and the
LoRA adapters each replica most likely holds, and where each session was last sent. It imports nothing of the app
but metric names: every process that routes (the HTTP door, each handle's owner) imports it."""

from .router import TokenLoadRouter

__all__ = ["TokenLoadRouter"]
