-- Read one semaphore or read-write lock for operators (inspect.py); writes
-- nothing. Both keep their holders the same way. After _prelude.lua alone:
-- the keys may be of any type, or none.
-- KEYS[1] holders zset, KEYS[2] queue list, KEYS[3] state hash (see
-- _holders.lua).
-- ARGV[1] the state field read second: l (a semaphore's limit) or f (a
--         read-write lock's last writer fence)
-- ARGV[2] '' or the prefix of one more field read per holder: m: (a
--         read-write lock holder's mode)
-- ARGV[3] how many live waiters to list (absent: none), oldest first
-- Returns false when KEYS[1] is not a zset, otherwise {name, ARGV[1]'s field,
-- live waiters, server now ms, {token1, entry1, ...} (the first waiters and
-- their w: entries, <deadline ms>|<mode><channel>), token1, expiry1, owner1,
-- acquired1, renewed1 (e:, '' when never)[, extra1], ...} for the holders not
-- yet expired, soonest expiry first. Reservations for woken waiters
-- (r:<token>) are not holders yet: left out.
if redis.call('TYPE', KEYS[1]).ok ~= 'zset' then
  return false
end
common() -- lib.alive()
local hash = redis.call('TYPE', state).ok == 'hash'
local function field(name)
  if not hash then
    return ''
  end
  return redis.call('HGET', state, name) or ''
end
local waiting = 0
local listed = {}
local shown = tonumber(ARGV[3] or '0') or 0
if hash and redis.call('TYPE', queue).ok == 'list' then
  for _, token in ipairs(redis.call('LRANGE', queue, 0, -1)) do
    local info = field('w:' .. token)
    if info ~= '' and lib.alive(info) then
      waiting = waiting + 1
      if waiting <= shown then
        table.insert(listed, token)
        table.insert(listed, info)
      end
    end
  end
end
local out = {field('n'), field(ARGV[1]), waiting, lib.now(), listed}
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. lib.now(), '+inf', 'WITHSCORES')
for i = 1, #live, 2 do
  local token = live[i]
  if field('r:' .. token) == '' then
    table.insert(out, token)
    table.insert(out, live[i + 1])
    table.insert(out, field('o:' .. token))
    table.insert(out, field('a:' .. token))
    table.insert(out, field('e:' .. token))
    if ARGV[2] ~= '' then
      table.insert(out, field(ARGV[2] .. token))
    end
  end
end
return out
