-- Replace a hash with the given fields and give it a TTL, in one step, for
-- an idempotency record (django_redislock/core/drivers/records_base.py): a duplicate never
-- reads a record half replaced. With a holder, only the record that attempt
-- wrote is replaced: a response is stored over its own request's marker,
-- never over the record of an attempt that ran after that marker was lost.
-- Stand-alone, no prelude; one key, so one slot on a Cluster (MULTI is
-- refused there by some redis-py versions).
-- KEYS[1] the hash.
-- ARGV[1] TTL, ms.  ARGV[2] the attempt that must hold the hash (its field
-- a), or '' for none.  ARGV[3..] field, value, field, value, ...
-- Returns 1 if the hash was replaced, 0 if it was another attempt's or gone.
-- A TTL Redis would refuse only after the write (see the prelude's MS):
-- refused first, so the hash never stays without one.
if not string.find(ARGV[1], '^%d%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?$') then
  return redis.error_reply('ERR a duration must be a whole number of ms, at most 12 digits: ttl')
end
if ARGV[2] ~= '' and redis.call('HGET', KEYS[1], 'a') ~= ARGV[2] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
