-- Force-release (operators): drop one holder, or every holder and
-- reservation, and admit the waiters that may come next. Former holders learn
-- of it at their next refresh or release.
-- KEYS: holders, queue, state. ARGV[1] grace ms. ARGV[2] token, or '' for all.
-- Returns how many turns (or reservations) were dropped.
local removed = 0
if ARGV[2] ~= '' then
  if redis.call('ZREM', holders, ARGV[2]) == 1 then
    losses().holders_lost(state, { ARGV[2] })
    forget(ARGV[2], nil)
    removed = 1
  end
else
  local all = redis.call('ZRANGE', holders, 0, -1)
  if #all > 0 then
    losses().holders_lost(state, all)
  end
  for _, token in ipairs(all) do
    forget(token, nil)
  end
  removed = #all
  redis.call('DEL', holders)
end
purge()
promote(tonumber(ARGV[1]), false, nil)
return removed
