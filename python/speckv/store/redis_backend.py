"""``RedisBackend``: entries on a Redis server or a Redis Cluster (``SET NX``), its budget the
server's."""

from __future__ import annotations

from typing import Any

from .entry import StoreError, check_key

# the URL scheme of a Redis Cluster (``redis-cluster://host:port``, any node)
CLUSTER_SCHEME = "redis-cluster://"
# every URL scheme a Redis store is named by
SCHEMES = ("redis://", "rediss://", "unix://", CLUSTER_SCHEME)


class RedisBackend:
    """Entries in a Redis server, under ``prefix`` + key. ``url`` as the ``redis`` package
    reads it (``redis://host:port/db``); ``redis-cluster://host:port`` for a Redis Cluster
    (any of its nodes: the client finds the others and sends each key to its slot's master;
    every call is on one key, so the guarantees are a single server's); or an existing
    ``client`` (its own settings).

    ``timeout_s`` bounds connecting and every reply (the client's defaults differ by version
    and may wait for minutes): a stalled server costs at most that per call, then
    ``StoreError``; the URL's own ``socket_timeout`` / ``socket_connect_timeout`` win."""

    DEFAULT_TIMEOUT_S = 1.0

    def __init__(
        self,
        url: str | None = None,
        *,
        client: Any = None,
        prefix: str = "speckv:",
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if client is None:
            try:
                import redis
            except ImportError:
                raise StoreError("RedisBackend needs the redis package: pip install 'speckv-rs[store]'") from None
            if not timeout_s > 0:
                raise StoreError(f"timeout_s: must be positive, got {timeout_s}")
            url = url or "redis://127.0.0.1:6379/0"
            options = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
            for name in list(options):
                if name + "=" in url:  # the URL's query says otherwise
                    del options[name]
            try:
                if url.startswith(CLUSTER_SCHEME):
                    from redis.cluster import RedisCluster

                    client = RedisCluster.from_url("redis://" + url[len(CLUSTER_SCHEME) :], **options)
                else:
                    client = redis.Redis.from_url(url, **options)
            except Exception as e:  # a malformed URL
                raise StoreError(f"redis: {e}") from None
        self.client = client
        self.prefix = prefix

    def __repr__(self) -> str:
        if type(self.client).__name__ == "RedisCluster":
            return f"RedisBackend(cluster, prefix={self.prefix!r})"
        kw = getattr(getattr(self.client, "connection_pool", None), "connection_kwargs", {})
        where = f"{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}" if "host" in kw else "a client"
        return f"RedisBackend({where}, prefix={self.prefix!r})"

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # redis.exceptions.RedisError and socket errors
            raise StoreError(f"redis: {e}") from None

    def get(self, key: str) -> bytes | None:
        return self._call(self.client.get, self.prefix + check_key(key))

    def has(self, key: str) -> bool:
        return bool(self._call(self.client.exists, self.prefix + check_key(key)))

    def put(self, key: str, value: bytes, parent: str | None = None) -> bool:
        return bool(self._call(self.client.set, self.prefix + check_key(key), bytes(value), nx=True))

    def delete(self, key: str) -> None:
        self._call(self.client.delete, self.prefix + check_key(key))

    def keys(self) -> list[str]:
        # the prefix is literal, SCAN's MATCH a glob: its special characters are escaped
        pattern = "".join("\\" + c if c in "*?[]\\^" else c for c in self.prefix) + "*"
        names = self._call(lambda: list(self.client.scan_iter(match=pattern)))
        return [n.decode()[len(self.prefix) :] if isinstance(n, bytes) else n[len(self.prefix) :] for n in names]

    def nbytes(self) -> int:
        return sum(int(self._call(self.client.strlen, self.prefix + k)) for k in self.keys())
