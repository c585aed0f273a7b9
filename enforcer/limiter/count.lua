-- count.lua: the driver of the count script, appended after the algorithm
-- chunks (script.go assembles it like take.lua). It adds hits that were
-- admitted elsewhere (an RLQS client's usage report) to one limit's
-- counter, whether or not they fit, and reports what remains.
--
-- The hits happened over the elapsed time before now, not at now. A token
-- or leaky bucket is therefore charged as of now - elapsed (at most one
-- period back): the refill of that time is credited against them, as it
-- would have been had each hit been counted when it happened, so a report
-- of a client that admitted at the limit's rate leaves the bucket where
-- checks at that rate would have, instead of in debt by the whole report.
-- The windows count the hits in the current window. A sliding_window_log
-- logs at most what its window has room for, so the log never holds more
-- than limit members (a full window rejects until it slides either way).
--
-- KEYS[1]    the limit's state key.
-- ARGV[1]    "" for Redis TIME, else a time in µs (tests only).
-- ARGV[2..6] algorithm code, limit, period (µs), capacity, calendar.
-- ARGV[7]    hits (> 0), ARGV[8] elapsed (µs, >= 0).
-- Returns    remaining after the hits (floor, 0..capacity), reset_after
--            (µs) and the time used (µs).
if redis.replicate_commands then
	redis.replicate_commands()
end

local key = KEYS[1]
local tonumber, floor, ceil = tonumber, math.floor, math.ceil
local MAX_US = 9000000000000000 -- as in take.lua
local now
if ARGV[1] ~= "" then
	now = tonumber(ARGV[1])
else
	local t = redis.call("TIME")
	now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local code = ARGV[2]
local alg = algorithm(code)
if alg == nil then
	return redis.error_reply("ERR sluice count: unknown algorithm " .. tostring(code))
end
local limit, period, cap, cal = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local hits, elapsed = tonumber(ARGV[7]), tonumber(ARGV[8])

local function clamp(x, hi)
	if x ~= x or x < 0 then
		return 0
	elseif x > hi then
		return hi
	end
	return x
end

local at = now
if code == "tb" or code == "lb" then
	if elapsed > period then
		elapsed = period
	end
	at = now - elapsed
end
local st = alg.load(key, now, period)
if code == "sl" then
	local _, _, _, rem0 = alg.decide(key, st, now, limit, period, cap, 0, cal, 0, false)
	if hits > floor(rem0) then
		hits = floor(rem0)
	end
end
if hits > 0 then
	local _, _, _, _, _, state = alg.decide(key, st, at, limit, period, cap, hits, cal, 0, true)
	if state ~= nil then
		alg.store(key, state, now, period)
		st = state
	end
end
local _, _, _, rem, reset = alg.decide(key, st, now, limit, period, cap, 0, cal, 0, false)
return { clamp(floor(rem), cap), clamp(ceil(reset), MAX_US), now }
