"""The Redis scripts of a session: the compare-and-set (the only way a session is
written) and the read that skips an unchanged value.

A session is a hash with three fields: ``v``, its version (decimal), ``c``,
the encoded ``SessionContext`` (which carries the version too), and ``t``, a
random token of the write that stored them. Lua cannot decode protobuf or
Snappy, so the client builds the new value and the script only checks that
nobody wrote in between. In a cluster, every key a script touches must hash
to one slot: all keys of a bucket share the ``{shard_NN}`` tag, so the
bucket's archive outbox stream (issue 5) is ``KEYS[2]``.

The archive record is added in the same script as the session write: both
happen or neither does, and a replica receives them together. The outbox is
bounded by a length check rather than ``XADD MAXLEN``: trimming would
silently delete the oldest records — possibly ones a reader is writing or
must claim — while the check refuses the new record and says so, so that it
is counted. The session write is made either way: a full archive never fails
a request.

Why the token: a gateway keeps the session it last read or wrote, decoded, in
its LRU, and asks Redis only whether it is still current (:data:`READ_SCRIPT`),
which saves the transfer and the decode of the whole value on every turn. The
version alone cannot answer that: a deleted or expired session starts again at
version 1, so "version 3" may be another conversation than the cached one. A
token is written by exactly one write; a delete or expiry removes it with the
hash, and any later write changes the version (writers that predate the token
leave ``t`` alone, but always raise ``v``), so a matching (version, token)
pair means nothing was written since. A value without a token is never
treated as current.
"""

from __future__ import annotations

WRITTEN = 1
"""The session was written (and its record, if any, added to the outbox)."""
WRITTEN_OUTBOX_FULL = 2
"""The session was written; the outbox was full, so its record was not added."""

APPEND_SCRIPT = """
-- KEYS[1]  the session hash: v = version, c = encoded SessionContext, t = write token
-- KEYS[2]  optional: the bucket's archive outbox stream {prefix}{shard_NN}:outbox
-- ARGV[1]  the version the writer read ("0": the session must not exist)
-- ARGV[2]  the new version
-- ARGV[3]  the new encoded SessionContext
-- ARGV[4]  the idle TTL in milliseconds (every write starts it again)
-- ARGV[5]  the new write's token (random, unique to this write)
-- ARGV[6]  with KEYS[2]: the records the outbox may hold
-- ARGV[7]  with KEYS[2]: the turn's archive record
-- Returns 1 when written, 2 when written but the outbox was full (the record
-- is not added); on a conflict {0, value stored now, its token} (nil when
-- there is none), so the writer retries without another read.
local current = redis.call('HGET', KEYS[1], 'v')
if (current or '0') ~= ARGV[1] then
  local now = redis.call('HMGET', KEYS[1], 'c', 't')
  return {0, now[1], now[2]}
end
local written = 1
if KEYS[2] then
  -- First, so that a failing XADD (a key of the wrong type) leaves nothing written.
  if redis.call('XLEN', KEYS[2]) < tonumber(ARGV[6]) then
    redis.call('XADD', KEYS[2], '*', 'r', ARGV[7])
  else
    written = 2
  end
end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'c', ARGV[3], 't', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return written
"""

READ_SCRIPT = """
-- KEYS[1]  the session hash
-- ARGV[1]  the version the reader holds
-- ARGV[2]  the token of the value the reader holds ("": it holds none)
-- Returns 1 when the session is still at that version and token (the reader's
-- copy is current: nothing is sent); otherwise {value, its token}, each nil
-- when there is none.
local held = redis.call('HMGET', KEYS[1], 'v', 't')
if ARGV[2] ~= '' and held[1] == ARGV[1] and held[2] == ARGV[2] then
  return 1
end
return {redis.call('HGET', KEYS[1], 'c'), held[2]}
"""
UNCHANGED = 1
"""What :data:`READ_SCRIPT` returns when the reader's copy is current."""

VERSION_FIELD = "v"
CONTEXT_FIELD = "c"
TOKEN_FIELD = "t"
