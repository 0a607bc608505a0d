-- Give back a permit and wake as many waiters as permits are free.
-- KEYS: holders, queue, state. ARGV[1] token, ARGV[2] grace ms, ARGV[3] limit
-- (used only when the state has lost the current limit), ARGV[4] keep ms
-- (how long the state outlives this release at least).
-- Returns 1 when released, 0 when the caller held no live permit (it expired,
-- was cleared, or was never granted).
-- Repeatable: the state remembers the last RING tokens released (fields
-- d0..d63, and d = the slot the next one takes), so a retry of a release
-- whose reply was lost reports success, even when the permit went straight
-- on to a waiter. Memory: at most RING tokens of 32 characters per
-- semaphore, in its state hash, which expires keep ms after its last use.
-- A retry comes within moments (one reconnect): on a semaphore released more
-- than RING times meanwhile it would find its token overwritten and report
-- the permit lost, as before this memory existed.
local RING = 64
local token = ARGV[1]
local keep = tonumber(ARGV[4] or '@STATE_KEEP_MS@')
local score = redis.call('ZSCORE', holders, token)
local held = score and tonumber(score) > now_ms
  and redis.call('HEXISTS', state, 'r:' .. token) == 0
if score then
  redis.call('ZREM', holders, token)
  forget(token)
end
purge()
promote(current_limit(ARGV[3]), tonumber(ARGV[2]), false)
if held then
  local slot = tonumber(redis.call('HGET', state, 'd') or '0') % RING
  redis.call('HSET', state, 'd' .. slot, token, 'd', (slot + 1) % RING)
  -- The state may be gone (expired, or the permit was the last thing in it):
  -- HSET created it, and it must not stay without a TTL.
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
