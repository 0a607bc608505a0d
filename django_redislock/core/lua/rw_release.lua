-- Give back a reader's or the writer's turn and admit whoever may come next.
-- KEYS: holders, queue, state. ARGV[1] token, ARGV[2] grace ms, ARGV[3] keep
-- ms (how long the state outlives this release at least).
-- Returns 1 when released, 0 when the caller held no live turn (it expired,
-- was cleared, or was never granted).
-- Repeatable: the state remembers the last RING tokens released (fields
-- d0..d63, and d = the slot the next one takes), as sem_release.lua does, so
-- a retry of a release whose reply was lost reports success.
local RING = 64
local token = ARGV[1]
local keep = tonumber(ARGV[3])
local score = redis.call('ZSCORE', holders, token)
local st = redis.call('HMGET', state, 'r:' .. token, 'm:' .. token, 'd')
local held = score and tonumber(score) > now_ms and not st[1]
if score then
  redis.call('ZREM', holders, token)
  forget(token, st[2])
end
purge()
promote(tonumber(ARGV[2]), false, nil)
if held then
  local slot = tonumber(st[3] or '0') % RING
  redis.call('HSET', state, 'd' .. slot, token, 'd', (slot + 1) % RING)
  bump_ttl(state, keep)
  return 1
end
if not score then
  local slots = {}
  for i = 0, RING - 1 do
    slots[i + 1] = 'd' .. i
  end
  local released = redis.call('HMGET', state, unpack(slots))
  for i = 1, RING do
    if released[i] == token then
      return 1
    end
  end
end
return 0
