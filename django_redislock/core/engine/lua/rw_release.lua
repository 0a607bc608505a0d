-- Give back a reader's or the writer's turn and admit whoever may come next.
-- KEYS: holders, queue, state (see _holders.lua). ARGV[1] token, ARGV[2]
-- grace ms, ARGV[3] unused (callers send STATE_KEEP_MS; the scripts know it
-- as KEEP), ARGV[4] the turn's serial (optional).
-- Returns 1 when released, 0 when the caller held no live turn (it expired,
-- was cleared, or was never granted).
-- Repeatable: a retry of a release whose reply was lost reports success,
-- however many turns were released in between: the state remembers the
-- turns lost, not the ones released (see the memory of losses in the
-- prelude). Without the serial, only a turn still held is released.
local token = ARGV[1]
local score = redis.call('ZSCORE', holders, token)
local live = score and tonumber(score) > now_ms
local st = live and redis.call('HMGET', state, 'r:' .. token, 'm:' .. token, 's:' .. token, 'h')
if live then
  -- Ours, or a reservation (never ours to release). One that ran out is
  -- left to purge, which remembers it lost.
  redis.call('ZREM', holders, token)
  forget(token, st[2])
end
local purged = purge()
promote(tonumber(ARGV[2]), false, nil)
if live and not st[1] then
  released(st[3], st[4], purged)
  return 1
end
return score and 0 or common().losses().holder_released(ARGV[4])
