-- Release the lease if the caller still owns it: the barging order
-- (Lock(..., fair=False); see _barging.lua). The lease is freed and the
-- oldest waiter woken to look again, so the releasing process (or anyone)
-- may take it straight back; once the head of the queue has seen `limit`
-- others served, the lease is handed to it instead, as release.lua does.
-- KEYS: lease, queue, state. ARGV[1] token, ARGV[2] limit.
-- Returns 1 when released, 0 when the caller did not own the lease.
-- Repeatable, as release.lua (see `d` in the prelude).
local token = ARGV[1]
local holder = redis.call('HGET', lease, 't')
local st = redis.call('HMGET', state, 'd', 'q', 'b', 'w')
if holder ~= token then
  if st[1] and string.find(st[1], token, 1, true) then
    return 1
  end
  return 0
end
redis.call('DEL', lease)
redis.call('HSET', state, 'd', st[1] and token .. ' ' .. string.sub(st[1], 1, RECENT_KEPT) or token)
if st[2] then
  contended()
  if st[3] and tonumber(st[3]) >= tonumber(ARGV[2]) then
    slow.hand_off(false)
    redis.call('HDEL', state, 'b', 'w')
  else
    wake_head(st[4])
  end
end
return 1
