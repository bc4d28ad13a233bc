"""The compare-and-set script: the only way a session is written in Redis.

A session is a hash with two fields: ``v``, its version (decimal), and ``c``,
the encoded ``SessionContext`` (which carries the version too). Lua cannot
decode protobuf or Snappy, so the client builds the new value and the script
only checks that nobody wrote in between. In a cluster, every key a script
touches must hash to one slot: all keys of a bucket share the ``{shard_NN}``
tag, so the bucket's archive outbox stream (issue 5) is ``KEYS[2]``.

The archive record is added in the same script as the session write: both
happen or neither does, and a replica receives them together. The outbox is
bounded by a length check rather than ``XADD MAXLEN``: trimming would
silently delete the oldest records — possibly ones a reader is writing or
must claim — while the check refuses the new record and says so, so that it
is counted. The session write is made either way: a full archive never fails
a request.
"""

from __future__ import annotations

WRITTEN = 1
"""The session was written (and its record, if any, added to the outbox)."""
WRITTEN_OUTBOX_FULL = 2
"""The session was written; the outbox was full, so its record was not added."""

APPEND_SCRIPT = """
-- KEYS[1]  the session hash: v = version, c = encoded SessionContext
-- KEYS[2]  optional: the bucket's archive outbox stream {prefix}{shard_NN}:outbox
-- ARGV[1]  the version the writer read ("0": the session must not exist)
-- ARGV[2]  the new version
-- ARGV[3]  the new encoded SessionContext
-- ARGV[4]  the idle TTL in milliseconds (every write starts it again)
-- ARGV[5]  with KEYS[2]: the records the outbox may hold
-- ARGV[6]  with KEYS[2]: the turn's archive record
-- Returns 1 when written, 2 when written but the outbox was full (the record
-- is not added); on a conflict {0, value stored now} (no second element when
-- there is none), so the writer retries without another read.
local current = redis.call('HGET', KEYS[1], 'v')
if (current or '0') ~= ARGV[1] then
  return {0, redis.call('HGET', KEYS[1], 'c')}
end
local written = 1
if KEYS[2] then
  -- First, so that a failing XADD (a key of the wrong type) leaves nothing written.
  if redis.call('XLEN', KEYS[2]) < tonumber(ARGV[5]) then
    redis.call('XADD', KEYS[2], '*', 'r', ARGV[6])
  else
    written = 2
  end
end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'c', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return written
"""

VERSION_FIELD = "v"
CONTEXT_FIELD = "c"
