-- presence.lua: who is currently taking part in a limit. A sorted set of
-- members scored by the time (ms of Redis TIME) they stop counting; the
-- expired ones are trimmed on every call, so the set holds the members
-- whose time has not run out. The key expires with its last member.
--
-- KEYS[1]   the set's key.
-- ARGV[1]   "j" join (add or refresh the member), "l" leave (remove it) or
--           "c" count only.
-- ARGV[2]   the member; ARGV[3] its time to live in ms (join only, >= 1).
-- Returns   the number of members after the call.
if redis.replicate_commands then
	redis.replicate_commands()
end

local key, op = KEYS[1], ARGV[1]
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call("ZREMRANGEBYSCORE", key, "-inf", now)
if op == "j" then
	local ttl = tonumber(ARGV[3])
	redis.call("ZADD", key, now + ttl, ARGV[2])
	if redis.call("PTTL", key) < ttl then
		redis.call("PEXPIRE", key, ttl)
	end
elseif op == "l" then
	redis.call("ZREM", key, ARGV[2])
elseif op ~= "c" then
	return redis.error_reply("ERR sluice presence: unknown operation " .. tostring(op))
end
return redis.call("ZCARD", key)
