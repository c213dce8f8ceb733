"""Sleep and wake around the phases of a synchronous RL step on colocated engines, for the reference loop
(arctic_rl.loop) and the verl and SkyRL adapters alike: they call before_gen, after_gen and before_sync
where their step has those phase boundaries.
"""

from __future__ import annotations

from arctic_rl.client.client import ArcticRLClient


class EngineSleep:
    """Puts the engines a phase does not use to sleep, when they share devices and run in step (`enabled`:
    colocated, sync loop): trainer and reference asleep during gen, sampler asleep from the end of gen to the weight
    sync. The reference wakes only if the loss uses it. Remembers what it put to sleep, so each call is
    made once.

    The sampler sleeps at vLLM's level 2 (weights dropped, not copied to the host): the sync that ends its
    sleep reloads every weight anyway. Order at the sync: wake the sampler (vLLM reallocates its weights
    and KV cache), then sync_weights loads the trainer's weights into it; the controller refuses generate
    between a level-2 sleep and the next sync. A run that stopped in between leaves the sampler without
    weights: wake_all syncs it then (health's sampler_weights_dropped)."""

    SAMPLER_LEVEL = 2  # a sync always follows the sampler's sleep before the next generate

    def __init__(self, client: ArcticRLClient, use_reference: bool, enabled: bool):
        self.client, self.use_reference, self.enabled = client, use_reference, enabled
        # what the backend says is asleep now (a given client may come from a run that stopped mid-step)
        health = client.health()
        self.asleep: set[str] = set(health.get("asleep", []))
        self.needs_sync = bool(health.get("sampler_weights_dropped", False))

    def _set(self, engine: str, asleep: bool) -> None:
        if not self.enabled or (engine in self.asleep) == asleep:
            return
        if asleep and engine == "sampling":
            self.client.sleep(engine, level=self.SAMPLER_LEVEL)
            self.needs_sync = True
        else:
            (self.client.sleep if asleep else self.client.wake)(engine)
        (self.asleep.add if asleep else self.asleep.discard)(engine)

    def before_gen(self) -> None:
        self._set("sampling", False)
        self._set("training", True)
        self._set("reference", True)

    def after_gen(self) -> None:
        self._set("sampling", True)
        self._set("training", False)
        if self.use_reference:
            self._set("reference", False)

    def before_sync(self) -> None:
        self._set("reference", True)
        self._set("sampling", False)  # awake before the sync: it loads the weights a level-2 sleep dropped
        self.needs_sync = False

    def wake_all(self) -> None:
        """Every engine awake (also when this run sleeps none: they may be left asleep by an earlier run),
        and a sampler whose weights a level-2 sleep dropped synced."""
        for engine in sorted(self.asleep, key=("sampling", "training", "reference").index):
            self.client.wake(engine)
            self.asleep.discard(engine)
        if self.needs_sync:
            self.client.sync_weights()
            self.needs_sync = False
