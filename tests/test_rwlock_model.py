"""A model-based test of read-write lock admission: Hypothesis stateful testing on a real Redis.

The scripts are driven directly, with tokens the model chooses, through random
interleavings of: try-acquire (read or write, never queueing), acquire with a
wait (which queues, with no wake-up channel: the waiter finds a turn reserved
for it at its next attempt), release, a release sent again (its reply lost),
give-up (the cancel script) and force-release of one holder. A plain Python
model says what each reply must be and what Redis must hold: FIFO order,
readers at the head admitted together, a writer at the head alone, newcomers
never past the queue. After every step:

1. exclusion, read from Redis: a writer is never a holder beside anyone else;
2. the holders, their modes, the reservations and the queue are the model's;
3. writer fences, and the serials of all holders, strictly increase;
4. every key has a TTL;
5. a release sent again is never told "released" for a turn that was lost,
   and told "lost" for one released only once more than LOST turns granted
   after it were lost (lua/_prelude.lua).
"""

from __future__ import annotations

from typing import Any

import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from django_redislock.core import KeySpace
from django_redislock.core.drivers.rwlock import ACQUIRE, CANCEL, CLEAR, RELEASE
from django_redislock.core.io import calls
from tests.servers import RedisServer

KS = KeySpace("rwmodel")
NAME = "doc"
KEYS = KS.rwlock(NAME)
KEY_TUPLE = (KEYS.lease, KEYS.queue, KEYS.state)
TOKENS = [f"{i:016x}" for i in range(8)]
LOST = 3  # lua/_prelude.lua
LONG = 600_000  # ms: no lease, reservation or wait runs out during a run
_server: dict[str, Any] = {}


def _client() -> redis.Redis:
    if "client" not in _server:
        server = RedisServer()
        server.start()
        _server["server"] = server
        _server["client"] = server.client(socket_timeout=5)
    return _server["client"]


class RWModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.r = _client()
        self.r.flushall()
        self.holders: dict[str, str] = {}  # token -> "r" | "w"
        self.reserved: set[str] = set()
        self.queue: list[tuple[str, str]] = []
        self.fence = 0
        # Serials: of each turn held, of the last turn each token ended (and
        # whether by release), of every turn lost; the last one issued.
        self.serials: dict[str, int] = {}
        self.ended: dict[str, tuple[int, bool]] = {}
        self.lost: list[int] = []
        self.last_serial = 0

    # -- the model ------------------------------------------------------------
    def _compatible(self, mode: str) -> bool:
        if mode == "w":
            return not self.holders
        return "w" not in self.holders.values()

    def _promote(self, me: str | None) -> bool:
        mine = False
        while self.queue:
            token, mode = self.queue[0]
            if not self._compatible(mode):
                break
            self.queue.pop(0)
            self.holders[token] = mode
            if token == me:
                mine = True
            else:
                self.reserved.add(token)
            if mode == "w":
                break
        return mine

    def _expect_acquire(self, token: str, mode: str, wait: bool) -> bool:
        if token in self.holders:
            self.reserved.discard(token)
            return True
        if self._promote(token):
            return True
        if not self.queue and self._compatible(mode):
            self.holders[token] = mode
            return True
        if wait and all(t != token for t, _ in self.queue):
            self.queue.append((token, mode))
        return False

    def _mode_of(self, token: str) -> str:
        """A token keeps one mode for the whole run, as a handle does."""
        return "r" if TOKENS.index(token) % 3 else "w"

    # -- the rules ------------------------------------------------------------
    @rule(token=st.sampled_from(TOKENS), wait=st.booleans())
    def acquire(self, token: str, wait: bool) -> None:
        mode = self._mode_of(token)
        if token in self.holders and token not in self.reserved and not wait:
            return  # a handle does not acquire what it holds
        if token not in self.holders:
            self.ended.pop(token, None)  # a new acquisition (a real one has a new token)
        expected = self._expect_acquire(token, mode, wait)
        reply = calls.run(
            self.r,
            ACQUIRE,
            KEY_TUPLE,
            (token, LONG, NAME, "{}", LONG if wait else 0, b"-", LONG, 10_000, mode),
        )
        granted, fence = reply[:2]
        assert int(granted) == int(expected), (token, mode, wait)
        if expected and mode == "w" and int(fence) != self.fence:
            assert int(fence) > self.fence
            self.fence = int(fence)
        if expected:
            serial = int(reply[2])
            if token in self.serials:
                assert serial == self.serials[token]  # the same turn, asked again
            else:
                assert serial > self.last_serial
                self.serials[token] = self.last_serial = serial
            if mode == "w":
                assert serial == int(fence)

    @rule(token=st.sampled_from(TOKENS))
    def release(self, token: str) -> None:
        held = token in self.holders and token not in self.reserved
        released = calls.run(self.r, RELEASE, KEY_TUPLE, (token, LONG, 10_000))
        if held:
            assert released == 1
            self.ended[token] = (self.serials.pop(token), True)
        self.holders.pop(token, None)
        self.reserved.discard(token)
        self._promote(None)

    @rule(token=st.sampled_from(TOKENS))
    def release_again(self, token: str) -> None:
        # The release of the token's last turn, sent again: its reply was lost.
        if token not in self.ended or token in self.holders:
            return  # (a real retry's token never holds again: tokens are not reused)
        serial, released = self.ended[token]
        answer = calls.run(self.r, RELEASE, KEY_TUPLE, (token, LONG, 10_000, serial))
        if not released:
            assert answer == 0, "a lost turn reported released"
        elif answer == 0:
            assert sum(1 for s in self.lost if s > serial) > LOST, "a release reported lost"

    @rule(token=st.sampled_from(TOKENS))
    def give_up(self, token: str) -> None:
        calls.run(self.r, CANCEL, KEY_TUPLE, (token, LONG))
        self.serials.pop(token, None)  # given back unheard: nobody releases it
        if token in self.holders:
            del self.holders[token]
            self.reserved.discard(token)
        else:
            self.queue = [(t, m) for t, m in self.queue if t != token]
        self._promote(None)

    @rule(token=st.sampled_from(TOKENS))
    def force_release(self, token: str) -> None:
        dropped = calls.run(self.r, CLEAR, KEY_TUPLE, (LONG, token))
        assert dropped == (1 if token in self.holders else 0)
        if token in self.serials:
            serial = self.serials.pop(token)
            self.lost.append(serial)
            self.ended[token] = (serial, False)
        self.holders.pop(token, None)
        self.reserved.discard(token)
        self._promote(None)

    # -- the invariants ---------------------------------------------------------
    @invariant()
    def redis_agrees(self) -> None:
        members = {t.decode() for t in self.r.zrange(KEYS.lease, 0, -1)}
        state = {k.decode(): v.decode() for k, v in self.r.hgetall(KEYS.state).items()}
        modes = {t: state.get(f"m:{t}") for t in members}
        writers = [t for t, m in modes.items() if m == "w"]
        assert not writers or len(members) == 1, modes  # exclusion
        assert modes == self.holders
        assert {t for t in members if f"r:{t}" in state} == self.reserved
        assert [t.decode() for t in self.r.lrange(KEYS.queue, 0, -1)] == [t for t, _ in self.queue]
        assert state.get("x") == (writers[0] if writers else None)
        for key in KEY_TUPLE:
            assert self.r.pttl(key) != -1, key


RWModel.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)


class TestRWModel(RWModel.TestCase):  # type: ignore[name-defined,misc]
    @classmethod
    def tearDownClass(cls) -> None:
        server = _server.pop("server", None)
        client = _server.pop("client", None)
        if client is not None:
            client.close()
        if server is not None:
            server.stop()
        super().tearDownClass()
