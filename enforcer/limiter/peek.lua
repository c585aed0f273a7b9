-- peek.lua: the driver of the peek script, appended after the algorithm
-- chunks (script.go assembles it like take.lua). It reads limits' counters
-- and writes nothing: each key's state is loaded and decided for 0 hits by
-- the same algorithm modules a Take runs, and no module's store is called.
-- Go runs it with EVALSHA_RO where the server has it (Redis 7+), so Redis
-- itself refuses any write the script might attempt.
--
-- KEYS       one state key per limit, in order (all on one hash slot).
-- ARGV[1]    "" for the time from Redis TIME, else a time in µs (tests).
-- Then five values per limit: algorithm code, limit, period (µs), capacity
--            (burst of a bucket, limit of a window), calendar (0 none, 1 day,
--            2 week, 3 month, 4 year).
-- Returns    two integers per limit: remaining (floor, within 0..capacity)
--            and reset_after (µs until the limit is back to full if nothing
--            else arrives), then the time used (µs).
local KEYS, ARGV, tonumber, floor, ceil = KEYS, ARGV, tonumber, math.floor, math.ceil
local MAX_US = 9000000000000000 -- as in take.lua

local now
if ARGV[1] ~= "" then
	now = tonumber(ARGV[1])
else
	local t = redis.call("TIME")
	now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function clamp(x, hi)
	if x ~= x or x < 0 then
		return 0
	elseif x > hi then
		return hi
	end
	return x
end

local out = {}
for i = 1, #KEYS do
	local a = 2 + (i - 1) * 5
	local alg = algorithm(ARGV[a])
	if alg == nil then
		return redis.error_reply("ERR sluice peek: unknown algorithm " .. tostring(ARGV[a]))
	end
	local limit, period, cap, cal = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
	local key = KEYS[i]
	local st = alg.load(key, now, period)
	local _, _, _, rem0, reset0 = alg.decide(key, st, now, limit, period, cap, 0, cal, 0, false)
	out[2 * i - 1] = clamp(floor(rem0), cap)
	out[2 * i] = clamp(ceil(reset0), MAX_US)
end
out[#out + 1] = now
return out
