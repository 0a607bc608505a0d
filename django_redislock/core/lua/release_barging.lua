-- Release the lease if the caller still owns it: the barging order
-- (Lock(..., fair=False); see _barging.lua). The lease is freed and the
-- oldest waiter woken to look again, so the releasing process (or anyone)
-- may take it straight back; once the head of the queue has seen `limit`
-- others served, the lease is handed to it instead, as release.lua does.
-- KEYS: lease, queue, state. ARGV[1] token, ARGV[2] limit, ARGV[3] its
-- fence (optional).
-- Returns 1 when released, 0 when the caller did not own the lease.
-- Repeatable, as release.lua.
local token = ARGV[1]
local held = redis.call('HMGET', lease, 't', 'f')
if held[1] ~= token then
  return contended().released_before(ARGV[3])
end
redis.call('DEL', lease)
redis.call('HSET', state, 'e', held[2])
local st = redis.call('HMGET', state, 'q', 'b', 'w')
if st[1] then
  contended()
  if st[2] and tonumber(st[2]) >= tonumber(ARGV[2]) then
    slow.hand_off(false)
    redis.call('HDEL', state, 'b', 'w')
  else
    wake_head(st[3])
  end
end
return 1
