-- Force-release (operators) of a semaphore or read-write lock: drop one
-- holder, or every holder and reservation, and admit the waiters that may
-- come next. Former holders learn of it at their next refresh or release.
-- KEYS: holders, queue, state (see _holders.lua). ARGV[1] grace ms. ARGV[2]
-- token, or '' for all.
-- Returns how many permits or turns (or reservations) were dropped.
local removed
if ARGV[2] == '' then
  removed = purge(true)
else
  removed = redis.call('ZREM', holders, ARGV[2])
  if removed == 1 then
    common().losses().holders_lost({ ARGV[2] })
    forget(ARGV[2], nil)
  end
  purge()
end
promote(tonumber(ARGV[1]), false)
return removed
