-- A waiter gives up (timeout, cancellation, interrupt, a reply that never
-- came): give back a lease that was granted or handed to it without its
-- hearing of it, leave the queue, and remember the token (see `d` in
-- _lock.lua) so that its acquire, if it is still on its way, grants nothing.
-- KEYS: lease, queue, state (see _lock.lua). ARGV[1] token.
-- Returns 1 when a lease was passed on, 0 otherwise.
local token = ARGV[1]
local st = redis.call('HMGET', state, 'd', 'q', 'f', 'n', 'h')
local given = st[1] and token .. ' ' .. string.sub(st[1], 1, RECENT_KEPT) or token
local held = redis.call('HMGET', lease, 't', 'f')
if held[1] == token then
  redis.call('DEL', lease)
  -- Nobody holds that lease, nobody will release it: no loss to remember.
  redis.call('HSET', state, 'd', given, 'e', held[2])
else
  redis.call('HSET', state, 'd', given)
end
-- The state may not have existed: it must not be left without a TTL.
outlive(KEEP, state)
if held[1] == token then
  if st[2] then
    mark = st[2]
    contended().hand_off(false, st[3], held[2], st[4], st[5])
  end
  return 1
end
if redis.call('HDEL', state, token) == 1 then
  -- Queued as a bare token (the barging order, or an earlier version).
  redis.call('LREM', queue, 1, token)
elseif st[2] then
  -- Queued in the first-come order: its element starts with its token.
  local prefix = token .. '|'
  for _, element in ipairs(redis.call('LRANGE', queue, 0, -1)) do
    if string.sub(element, 1, #prefix) == prefix then
      redis.call('LREM', queue, 1, element)
      break
    end
  end
end
return 0
