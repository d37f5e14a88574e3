"""``StateStore`` on one Redis that every replica reaches (redis.asyncio): what one replica records, the others see.

Each operation is one round trip: a plain command, a MULTI block, or a Lua script registered once (loaded again by
its digest after a Redis restart). Buckets and windows read Redis's own ``TIME`` inside their scripts, so replicas
whose clocks disagree agree about refills. Keys are ``key_prefix`` plus the caller's string, sent as a command
argument, never as a pattern: nothing here lists keys (no KEYS, no SCAN), so a ``*`` or ``:`` in a session id or an
identity is just a character of its key.

Connections: one bounded pool per store (``max_connections``; a caller past the bound waits up to ``timeout`` for
one to come free, then fails), one of which, shared by every subscription, carries pub/sub. Every socket has a short
connect and read timeout, so a Redis that is gone or hung becomes ``StateUnavailable`` naming the store
(``host:port/db``, never the password) within about ``timeout`` seconds. Nothing is retried here: the next operation
after Redis is back gets a fresh connection (the pool drops the ones the restart closed), and the subscriptions
subscribe again by themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any, AsyncIterator, Awaitable, Sequence, TypeVar

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError, ResponseError

from bastion.state.config import DEFAULT_MAX_CONNECTIONS, DEFAULT_PREFIX, DEFAULT_TIMEOUT, describe
from bastion.state.store import TAKEN, Bucket, StateUnavailable, Taken

T = TypeVar("T")

_RECONNECT_CAP = 2.0  # the longest pause between a lost subscription connection's attempts to come back

# Numbers leave scripts as strings: a Lua number returned to Redis is cut to an integer, and one passed to a command
# is written with 14 digits (1e+15 for a long expiry, which PEXPIRE refuses), so each is formatted on purpose.
_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local levels = {}
local wait, refused = 0, -1
for i, key in ipairs(KEYS) do
  local rate, burst = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  local found = redis.call('HMGET', key, 't', 'u')
  local tokens = burst
  if found[1] then
    tokens = math.min(burst, tonumber(found[1]) + math.max(0, now - tonumber(found[2])) * rate)
  end
  levels[i] = tokens
  if tokens < 1 then
    local delay = (1 - tokens) / rate
    if delay > wait then wait, refused = delay, i - 1 end
  end
end
if wait > 0 then return {refused, string.format('%.17g', wait)} end
for i, key in ipairs(KEYS) do
  local rate, burst = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  redis.call('HSET', key, 't', string.format('%.17g', levels[i] - 1), 'u', string.format('%.17g', now))
  -- Kept while it refills: a full bucket is the same as none, so it may expire then.
  redis.call('PEXPIRE', key, string.format('%d', math.min(math.ceil((burst / rate + 1) * 1000), 1e15)))
end
return {-1, '0'}
"""

_HIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.17g', now - window))
local count = redis.call('ZCARD', KEYS[1])
if count >= limit then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if oldest[2] == nil then return string.format('%.17g', window) end
  return string.format('%.17g', math.max(tonumber(oldest[2]) + window - now, 1e-9))
end
-- A member per event: its time and the count before it, unique even for events in one microsecond.
redis.call('ZADD', KEYS[1], string.format('%.17g', now), t[1] .. '.' .. t[2] .. ':' .. count)
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.min(math.ceil(window * 1000), 1e15)))
return '0'
"""

_ADD = """
local delta = tonumber(ARGV[1])
local count = tonumber(redis.call('GET', KEYS[1]) or '0') + delta
if ARGV[2] ~= '' and delta > 0 and count > tonumber(ARGV[2]) then return false end
if count <= 0 then
  redis.call('DEL', KEYS[1])
elseif ARGV[3] ~= '' then
  redis.call('SET', KEYS[1], count, 'PX', ARGV[3])
else
  redis.call('SET', KEYS[1], count)
end
return count
"""

# A log is a stream whose entry ids are the log's numbers ("N-0"): the next number is one more than the last entry's
# (a log keeps at least its last entry), and a log that expired or was deleted starts again at 1.
_APPEND = """
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local number = 1
if last[1] then number = tonumber(string.match(last[1][1], '^(%d+)')) + 1 end
redis.call('XADD', KEYS[1], 'MAXLEN', ARGV[2], number .. '-0', 'v', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return number
"""


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000 + 0.999))


class _Subscription:
    """One subscriber's messages, delivered by the store's one pub/sub connection."""

    def __init__(self, hub: "_Hub", channel: bytes) -> None:
        self._hub = hub
        self.channel = channel
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    def deliver(self, message: bytes | None) -> None:
        self._queue.put_nowait(message)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            message = await self._queue.get()
            if message is None:
                return
            yield message

    async def aclose(self) -> None:
        await self._hub.leave(self)
        self._queue.put_nowait(None)


class _Hub:
    """Every subscription of a store on one pub/sub connection. A reader task hands each message to the channel's
    subscribers; when the connection is lost it reconnects (pausing longer each time, up to ``_RECONNECT_CAP``) and
    subscribes to every channel that still has subscribers."""

    def __init__(self, redis: Redis, timeout: float, where: str) -> None:
        self._redis = redis
        self._timeout = timeout
        self._where = where
        self._listeners: dict[bytes, list[_Subscription]] = {}
        self._pubsub: PubSub | None = None
        self._reader: asyncio.Task[None] | None = None
        self._connecting = asyncio.Lock()
        self._confirmations: dict[tuple[bytes, bytes], asyncio.Future[None]] = {}

    async def join(self, channel: bytes) -> _Subscription:
        subscription = _Subscription(self, channel)
        listeners = self._listeners.setdefault(channel, [])
        listeners.append(subscription)
        if len(listeners) > 1:
            return subscription
        try:
            # Subscribed once Redis says so: a message published after this returns reaches the subscriber.
            pubsub = await self._connected()
            await self._confirmed(b"subscribe", channel, pubsub.subscribe(channel))
        except BaseException:
            self._forget(subscription)
            raise
        return subscription

    async def leave(self, subscription: _Subscription) -> None:
        if not self._forget(subscription) or subscription.channel in self._listeners:
            return
        pubsub = self._pubsub
        if pubsub is None:
            return
        # Unsubscribed once Redis says so, so a publish after this counts one subscriber fewer. A connection that
        # is down has no subscription to end, and the next one does not make it again.
        with contextlib.suppress(StateUnavailable):
            await self._confirmed(b"unsubscribe", subscription.channel, pubsub.unsubscribe(subscription.channel))

    def _forget(self, subscription: _Subscription) -> bool:
        listeners = self._listeners.get(subscription.channel)
        if not listeners or subscription not in listeners:
            return False
        listeners.remove(subscription)
        if not listeners:
            del self._listeners[subscription.channel]
        return True

    async def _confirmed(self, kind: bytes, channel: bytes, sent: Awaitable[Any]) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._confirmations[(kind, channel)] = done
        try:
            async with asyncio.timeout(self._timeout):
                await sent
                await done
        except (RedisError, OSError, TimeoutError) as error:
            raise StateUnavailable(f"the shared state ({self._where}) cannot be reached: {_why(error)}") from None
        finally:
            if self._confirmations.get((kind, channel)) is done:
                del self._confirmations[(kind, channel)]

    async def _connected(self) -> PubSub:
        async with self._connecting:
            if self._pubsub is None:
                try:
                    # Every channel with subscribers: this may be the connection that comes back after an outage.
                    self._pubsub = await self._open(tuple(self._listeners))
                except (RedisError, OSError, TimeoutError) as error:
                    raise StateUnavailable(
                        f"the shared state ({self._where}) cannot be reached: {_why(error)}") from None
            if self._reader is None or self._reader.done():
                self._reader = asyncio.create_task(self._read(), name="bastion-state-pubsub")
            return self._pubsub

    async def _read(self) -> None:
        pause = 0.05
        while True:
            pubsub = self._pubsub
            try:
                if pubsub is None:
                    pubsub = await self._reconnect()
                    pause = 0.05
                message = await pubsub.get_message(timeout=60.0)
            except Exception:  # noqa: BLE001 - whatever broke the connection, the subscriptions must come back
                await self._drop(pubsub)
                await asyncio.sleep(pause)
                pause = min(pause * 2, _RECONNECT_CAP)
                continue
            if message is not None:
                self._dispatch(message)

    async def _reconnect(self) -> PubSub:
        async with self._connecting:
            self._pubsub = await self._open(tuple(self._listeners))
            return self._pubsub

    async def _open(self, channels: tuple[bytes, ...]) -> PubSub:
        """A pub/sub connection subscribed to ``channels``; one that fails on the way gives its connection back to
        the pool (a Redis away for long must not use the pool up, one attempt at a time)."""
        pubsub = self._redis.pubsub()
        try:
            async with asyncio.timeout(self._timeout):
                await pubsub.connect()
                if channels:
                    await pubsub.subscribe(*channels)
        except BaseException:
            with contextlib.suppress(Exception):
                await pubsub.aclose()
            raise
        return pubsub

    async def _drop(self, pubsub: PubSub | None) -> None:
        if pubsub is not None and self._pubsub is pubsub:
            self._pubsub = None
        for done in self._confirmations.values():
            if not done.done():
                done.set_exception(OSError("the connection was lost"))
        if pubsub is not None:
            with contextlib.suppress(Exception):
                await pubsub.aclose()

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind, channel = message.get("type"), message.get("channel")
        if isinstance(kind, str):
            kind = kind.encode()
        if kind == b"message":
            for listener in list(self._listeners.get(channel, ())):
                listener.deliver(bytes(message["data"]))
            return
        done = self._confirmations.get((kind, channel))
        if done is not None and not done.done():
            done.set_result(None)

    async def aclose(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        await self._drop(self._pubsub)
        for listeners in list(self._listeners.values()):
            for listener in listeners:
                listener.deliver(None)
        self._listeners.clear()


def _why(error: BaseException) -> str:
    if isinstance(error, TimeoutError) and not str(error):
        return "no answer in time"
    text = str(error) or type(error).__name__
    return text.splitlines()[0][:300].rstrip(".")


class RedisStore:
    def __init__(
        self,
        url: str,
        *,
        password: str | None = None,
        username: str | None = None,
        key_prefix: str = DEFAULT_PREFIX,
        timeout: float = DEFAULT_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        tls_ca_file: str | None = None,
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
    ) -> None:
        self.where = describe(url)
        options: dict[str, Any] = {
            "max_connections": max_connections,
            "timeout": timeout,  # how long a caller waits for a free connection of the pool
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "retry": Retry(NoBackoff(), 0),
            "client_name": "bastion",
        }
        if password is not None:
            options["password"] = password
        if username is not None:
            options["username"] = username
        if url.startswith("rediss://"):
            options.update(ssl_cert_reqs=ssl.CERT_REQUIRED, ssl_ca_certs=tls_ca_file, ssl_certfile=tls_cert_file,
                           ssl_keyfile=tls_key_file)
        self._pool = BlockingConnectionPool.from_url(url, **options)
        self._redis = Redis(connection_pool=self._pool)
        self._prefix = key_prefix.encode()
        self._timeout = timeout
        self._take = self._redis.register_script(_TAKE)
        self._hit = self._redis.register_script(_HIT)
        self._add = self._redis.register_script(_ADD)
        self._append = self._redis.register_script(_APPEND)
        self._hub = _Hub(self._redis, timeout, self.where)

    @property
    def shared(self) -> bool:
        return True

    def _key(self, key: str) -> bytes:
        return self._prefix + key.encode("utf-8", "surrogatepass")

    async def _run(self, operation: Awaitable[T]) -> T:
        try:
            return await operation
        except ResponseError as error:  # reached, and refused: out of memory, a key of another type, a read-only replica
            raise StateUnavailable(f"the shared state ({self.where}) answered with an error: {_why(error)}") from None
        except (RedisError, OSError, TimeoutError) as error:
            raise StateUnavailable(f"the shared state ({self.where}) cannot be reached: {_why(error)}") from None

    # ------------------------------------------------------------------ single-use records
    async def claim(self, key: str, seconds: float) -> bool:
        return bool(await self._run(self._redis.set(self._key(key), b"1", nx=True, px=_ms(seconds))))

    async def recorded(self, key: str) -> bool:
        return bool(await self._run(self._redis.exists(self._key(key))))

    # ------------------------------------------------------------------ values
    async def get(self, key: str) -> bytes | None:
        return await self._run(self._redis.get(self._key(key)))

    async def put(self, key: str, value: bytes, seconds: float | None = None) -> None:
        await self._run(self._redis.set(self._key(key), bytes(value), px=None if seconds is None else _ms(seconds)))

    async def delete(self, key: str) -> bool:
        return bool(await self._run(self._redis.delete(self._key(key))))

    # ------------------------------------------------------------------ maps
    async def map_get(self, key: str, field: str) -> bytes | None:
        return await self._run(self._redis.hget(self._key(key), field.encode("utf-8", "surrogatepass")))

    async def map_all(self, key: str) -> dict[str, bytes]:
        found = await self._run(self._redis.hgetall(self._key(key)))
        return {field.decode("utf-8", "surrogatepass"): value for field, value in found.items()}

    async def map_put(self, key: str, values: dict[str, bytes], seconds: float | None = None) -> None:
        if not values and seconds is None:
            return
        name = self._key(key)
        mapping = {field.encode("utf-8", "surrogatepass"): bytes(value) for field, value in values.items()}
        if seconds is None:
            await self._run(self._redis.hset(name, mapping=mapping))
            return
        pipe = self._redis.pipeline(transaction=True)
        if mapping:
            pipe.hset(name, mapping=mapping)
        pipe.pexpire(name, _ms(seconds))
        await self._run(pipe.execute())

    async def map_delete(self, key: str, fields: Sequence[str]) -> None:
        if fields:
            await self._run(self._redis.hdel(self._key(key), *(f.encode("utf-8", "surrogatepass") for f in fields)))

    # ------------------------------------------------------------------ counters
    async def add(self, key: str, delta: int, *, limit: int | None = None,
                  seconds: float | None = None) -> int | None:
        found = await self._run(self._add(keys=[self._key(key)], args=[
            int(delta), "" if limit is None else int(limit), "" if seconds is None else _ms(seconds)]))
        return None if found is None else int(found)

    # ------------------------------------------------------------------ rate
    async def take(self, buckets: Sequence[Bucket]) -> Taken:
        if not buckets:
            return TAKEN
        args: list[str] = []
        for bucket in buckets:
            args += [repr(float(bucket.rate)), repr(float(bucket.burst))]
        refused, wait = await self._run(self._take(keys=[self._key(b.key) for b in buckets], args=args))
        return TAKEN if int(refused) < 0 else Taken(float(wait), int(refused))

    async def hit(self, key: str, limit: int, window: float) -> float:
        return float(await self._run(self._hit(keys=[self._key(key)], args=[int(limit), repr(float(window))])))

    # ------------------------------------------------------------------ numbered logs
    async def append(self, key: str, value: bytes, *, keep: int, seconds: float) -> int:
        return int(await self._run(self._append(keys=[self._key(key)],
                                                args=[bytes(value), max(1, int(keep)), _ms(seconds)])))

    async def read_after(self, key: str, after: int) -> tuple[int, list[tuple[int, bytes]]]:
        name = self._key(key)
        pipe = self._redis.pipeline(transaction=True)
        pipe.xrange(name, "-", "+", count=1)
        pipe.xrange(name, f"({max(0, int(after))}-0", "+")
        first, entries = await self._run(pipe.execute())
        if not first:
            return 0, []
        return _number(first[0][0]), [(_number(entry_id), fields[b"v"]) for entry_id, fields in entries]

    # ------------------------------------------------------------------ messages between replicas
    async def publish(self, channel: str, message: bytes) -> int:
        return int(await self._run(self._redis.publish(self._key(channel), bytes(message))))

    async def subscribe(self, channel: str) -> _Subscription:
        return await self._hub.join(self._key(channel))

    # ------------------------------------------------------------------ the store itself
    async def ping(self) -> None:
        await self._run(self._redis.ping())

    async def aclose(self) -> None:
        await self._hub.aclose()
        with contextlib.suppress(Exception):
            await self._redis.aclose()
        with contextlib.suppress(Exception):
            await self._pool.aclose()


def _number(entry_id: bytes) -> int:
    return int(entry_id.split(b"-", 1)[0])
