"""How the push dispatcher's loop waits between claims (jobs/dispatch.py): the dispatcher's half
of the wake-up protocol of jobs/queue/wakeup.py (docs/dispatcher.md, "Waking up").

After every claim the loop tells `IdleWait` what it found, and then waits with it:
- a full claim (as many jobs as asked): more may be queued, claim again at once;
- some jobs: give the guard back if held (under load publishes then commit without a NOTIFY) and
  look again after FIRST_RETRY_SECONDS, or sooner when a delivery ends;
- none: the dispatcher has caught up, and waits only with the guard, or knowing why it has not
  got it. Guard taken: claim once more at once (publishes that skipped their NOTIFY have all
  committed), then wait for a NOTIFY. Publishing transactions without a NOTIFY still open: claim
  again after a retry delay that doubles from FIRST_RETRY_SECONDS up to LONGEST_RETRY_SECONDS
  (a publish inside a producer's long transaction keeps every dispatcher from guarding until it
  commits: this is how soon its jobs go out after that, and what the wait costs: one empty
  claim per retry). Another dispatcher guards: wait for a NOTIFY (every listener gets it).
No wait is ever longer than --poll-seconds, nor than the next release of scheduled messages
(jobs/maintenance.py, every RELEASE_SECONDS): the loop then claims, and tries the guard again, so
the guard of a dispatcher that died is taken over within that; it is the backstop when nothing
else wakes the loop (the LISTEN connection lost, or none: tests drive the dispatcher without one).
"""

from __future__ import annotations

import asyncio
import contextlib

from jobs.queue import Guard, Listener

FIRST_RETRY_SECONDS = 0.005
LONGEST_RETRY_SECONDS = 0.05


class IdleWait:
    def __init__(self, poll_seconds: float) -> None:
        self.poll_seconds = poll_seconds
        self.listener: Listener | None = None  # set by `manage.py dispatch`
        self._longest = poll_seconds  # how long the next wait may last
        self._retry = FIRST_RETRY_SECONDS  # the next wait while publishes are in flight

    async def claimed(self, claimed: int | None, asked: int) -> None:
        """A claim of up to `asked` jobs took `claimed` (None: it failed)."""
        if claimed is None:
            self._longest = self.poll_seconds
            return
        if claimed:
            self._retry = FIRST_RETRY_SECONDS
            await self._stop_guarding()
            self._longest = 0.0 if claimed >= asked else FIRST_RETRY_SECONDS
            return
        self._longest = await self._caught_up()

    async def not_claiming(self) -> None:
        """No claim this turn (no room, or stopping): another dispatcher may guard instead."""
        await self._stop_guarding()
        self._longest = self.poll_seconds

    async def wait(self, woken: asyncio.Event, longest: float) -> None:
        """Until `woken` is set (a NOTIFY, a delivery ended) or for as long as the last claim
        allows, at most `longest`."""
        longest = min(longest, self._longest)
        if longest <= 0:
            await asyncio.sleep(0)  # deliveries get their turn of the loop
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(woken.wait(), longest)

    async def _caught_up(self) -> float:
        """The longest wait after an empty claim."""
        if self.listener is None or self.listener.guarding:
            return self.poll_seconds
        guard = await self.listener.try_guard()
        if guard is Guard.HELD:
            self._retry = FIRST_RETRY_SECONDS
            return 0.0  # claim once more: every publish without a NOTIFY has committed
        if guard is Guard.PUBLISHING:
            retry, self._retry = self._retry, min(2 * self._retry, LONGEST_RETRY_SECONDS)
            return min(retry, self.poll_seconds)
        return self.poll_seconds  # another dispatcher guards, or no LISTEN connection

    async def _stop_guarding(self) -> None:
        if self.listener is not None:
            await self.listener.stop_guarding()
