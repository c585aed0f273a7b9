-- lease.lua: the driver of the lease script, appended after the algorithm
-- chunks (script.go assembles it like take.lua). It grants a node a lease
-- of part of one limit's remaining quota, consumed here and now, or takes
-- back the unused units of one. It reads and writes the algorithms' state
-- through their modules, and knows the shape of two of them: the tables of
-- fixed_window.lua ({start, count, stop}) and sliding_window_counter.lua
-- ({start, cur, prev}); the buckets keep a number (TAT or empty-at).
--
-- KEYS[1]   the limit's state key.
-- ARGV[1]   "" for Redis TIME, else a time in µs (tests only).
-- ARGV[2..6] algorithm code, limit, period (µs), capacity, calendar.
-- ARGV[7]   "g" grant or "r" return, then three integers a, b, c:
--   grant:  a = units wanted, b = node count N, c = minimum remaining: grant
--           min(a, floor(remaining / (2N))) units, none when remaining < c.
--           Returns granted, remaining after, reset after (µs), epoch (the
--           window's start in µs; 0 for a bucket), the time in µs to the
--           end of the window the units count in and that end (µs; both 0
--           for a bucket).
--   return: a = units, b = the grant's epoch, c = the grant's window end
--           (µs): give a units back to the window they were counted in if
--           it is still current (a bucket: push its TAT back, never past
--           full). Returns the units taken back (0 when the window is over).
if redis.replicate_commands then
	redis.replicate_commands()
end

local key = KEYS[1]
local tonumber, floor, ceil = tonumber, math.floor, math.ceil
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
	return redis.error_reply("ERR sluice lease: unknown algorithm " .. tostring(code))
end
local limit, period, cap, cal = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local op, a, b, c = ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local st = alg.load(key, now, period)

if op == "g" then
	local _, _, _, rem0 = alg.decide(key, st, now, limit, period, cap, 0, cal, 0, false)
	rem0 = floor(rem0)
	if rem0 > cap then
		rem0 = cap
	end
	local g = floor(rem0 / (2 * b))
	if g > a then
		g = a
	end
	if rem0 < c or g < 1 then
		return { 0, rem0, 0, 0, 0, 0 }
	end
	local allowed, _, _, _, _, state, rem, reset = alg.decide(key, st, now, limit, period, cap, g, cal, 0, false)
	if not allowed or state == nil then
		return { 0, rem0, 0, 0, 0, 0 }
	end
	alg.store(key, state, now, period)
	local epoch, stop = 0, 0
	if type(state) == "table" then
		epoch = state.start
		stop = state.stop or (state.start + period)
	end
	if rem < 0 then
		rem = 0
	end
	local left = 0
	if stop > 0 then
		left = stop - now
	end
	return { g, floor(rem), ceil(reset), epoch, left, stop }
elseif op == "r" then
	if code == "fw" then
		if st.start ~= b or now >= c then
			return 0
		end
		local count = st.count - a
		if count < 0 then
			count = 0
		end
		alg.store(key, { start = b, count = count, stop = c }, now, period)
		return a
	elseif code == "sc" then
		if st.start == b then
			st.cur = st.cur - a
			if st.cur < 0 then
				st.cur = 0
			end
		elseif st.start == b + period then
			st.prev = st.prev - a
			if st.prev < 0 then
				st.prev = 0
			end
		else
			return 0
		end
		alg.store(key, st, now, period)
		return a
	elseif code == "tb" or code == "lb" then
		if not st or st <= now then
			return 0 -- full (empty) already: nothing to give back
		end
		local t = st - a * (period / limit)
		if t < now then
			t = now
		end
		alg.store(key, t, now, period)
		return a
	end
	return redis.error_reply("ERR sluice lease: algorithm " .. code .. " takes no leases")
end
return redis.error_reply("ERR sluice lease: unknown operation " .. tostring(op))
