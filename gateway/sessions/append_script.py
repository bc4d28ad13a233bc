"""The compare-and-set script: the only way a session is written in Redis.

A session is a hash with two fields: ``v``, its version (decimal), and ``c``,
the encoded ``SessionContext`` (which carries the version too). Lua cannot
decode protobuf or Snappy, so the client builds the new value and the script
only checks that nobody wrote in between. In a cluster, every key a script
touches must hash to one slot: all keys of a bucket share the ``{shard_NN}``
tag, so the bucket's outbox stream can be added to ``KEYS`` without breaking
that rule.
"""

from __future__ import annotations

APPEND_SCRIPT = """
-- KEYS[1]  the session hash: v = version, c = encoded SessionContext
-- ARGV[1]  the version the writer read ("0": the session must not exist)
-- ARGV[2]  the new version
-- ARGV[3]  the new encoded SessionContext
-- ARGV[4]  the idle TTL in milliseconds (every write starts it again)
-- Returns 1 when written; on a conflict {0, value stored now} (no second
-- element when there is none), so the writer retries without another read.
local current = redis.call('HGET', KEYS[1], 'v')
if (current or '0') ~= ARGV[1] then
  return {0, redis.call('HGET', KEYS[1], 'c')}
end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'c', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
-- Extension point (issue 5, archive outbox). Pass the bucket's outbox stream,
-- {prefix}{shard_NN}:outbox, as KEYS[2] (same hash tag: same slot) and the
-- archive record as further ARGV, and append it here, in the same atomic step:
--   if KEYS[2] then
--     redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'key', KEYS[1],
--                'version', ARGV[2], 'record', ARGV[6])
--   end
return 1
"""

VERSION_FIELD = "v"
CONTEXT_FIELD = "c"
