-- async.lua: the driver of the async flush script, appended after the
-- algorithm chunks (script.go assembles it like take.lua). A node that
-- counts a limit asynchronously admits requests from its local view and
-- sends what it admitted here, in one call for many keys: the hits are
-- counted unconditionally (they were admitted already), each in the window
-- of the time it was admitted, and the call reports each limit's remaining
-- after them: the fleet's total as this node learns it.
--
-- It knows the shape of two algorithms' state, the tables of
-- fixed_window.lua ({start, count, stop}) and sliding_window_counter.lua
-- ({start, cur, prev}); the buckets and the log are charged through their
-- own decide with force, at the hits' times.
--
-- KEYS      one state key per limit flushed.
-- ARGV[1]   "" for Redis TIME, else a time in µs (tests only).
-- ARGV[2]   the time in µs (Redis's clock) at which the node sent the call,
--           as the node estimates it never later than it was; "" for now.
--           The slots' ages count back from it (from now if it is later).
-- ARGV[3]   "" for no marker, else the marker's time to live in ms: the last
--           key is then the call's marker, a key named for the node's flush
--           and this call of it (in the first key's hash slot). A call whose
--           marker exists already was counted before (a retry of a flush
--           whose answer never came): it counts nothing again and reports
--           the remaining as any call does.
-- Then, per key: algorithm code, limit, period (µs), capacity, calendar,
--           the number S of slots, then S pairs: age (µs before ARGV[2] at
--           which the slot's hits were admitted, oldest first) and hits.
-- Returns   the time in µs (Redis's clock) the call ran at, then two
--           integers per key: remaining now (after the hits; may be
--           negative when the fleet admitted more than the limit) and the
--           µs until the limit is back to full.
if redis.replicate_commands then
	redis.replicate_commands()
end

local tonumber, floor, ceil = tonumber, math.floor, math.ceil
local now
if ARGV[1] ~= "" then
	now = tonumber(ARGV[1])
else
	local t = redis.call("TIME")
	now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local base = now
if ARGV[2] ~= "" then
	base = math.min(tonumber(ARGV[2]), now)
end

local nkeys, replay = #KEYS, false
if ARGV[3] ~= "" then
	nkeys = nkeys - 1
	replay = not redis.call("SET", KEYS[#KEYS], "1", "NX", "PX", ARGV[3])
end

local out, n = { now }, 1
local a = 4
for k = 1, nkeys do
	local key = KEYS[k]
	local code = ARGV[a]
	local alg = algorithm(code)
	if alg == nil then
		return redis.error_reply("ERR sluice async: unknown algorithm " .. tostring(code))
	end
	local limit, period, cap, cal = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
	local slots = tonumber(ARGV[a + 5])
	a = a + 6
	local st = alg.load(key, now, period)
	local dirty = false
	for _ = 1, slots do
		local t, hits = base - tonumber(ARGV[a]), tonumber(ARGV[a + 1])
		a = a + 2
		if hits > 0 and not replay then
			if code == "fw" then
				local start, stop = alg.window(t, period, cal)
				if st.start == start then
					st = { start = start, count = st.count + hits, stop = stop }
					dirty = true
				elseif st.start == nil or st.start < start then
					st = { start = start, count = hits, stop = stop }
					dirty = true
				end
				-- else: the hits' window is over; they count no more.
			elseif code == "sc" then
				local start = t - t % period
				if st.start == start then
					st = { start = start, cur = st.cur + hits, prev = st.prev }
					dirty = true
				elseif st.start == nil or st.start < start then
					local prev = 0
					if st.start == start - period then
						prev = st.cur
					end
					st = { start = start, cur = hits, prev = prev }
					dirty = true
				elseif st.start == start + period then
					st = { start = st.start, cur = st.cur, prev = st.prev + hits }
					dirty = true
				end
			elseif code == "sl" then
				-- One log entry per hit, at its time: written per slot.
				local s = alg.load(key, t, period)
				local _, _, _, _, _, state = alg.decide(key, s, t, limit, period, cap, hits, cal, 0, true)
				alg.store(key, state, t, period)
			else
				local _, _, _, _, _, state = alg.decide(key, st, t, limit, period, cap, hits, cal, 0, true)
				st, dirty = state, true
			end
		end
	end
	if code == "sl" then
		st = alg.load(key, now, period)
	elseif dirty then
		alg.store(key, st, now, period)
	end
	local _, _, _, rem0, reset0 = alg.decide(key, st, now, limit, period, cap, 0, cal, 0, false)
	if rem0 ~= rem0 then
		rem0 = 0
	end
	if reset0 ~= reset0 or reset0 < 0 then
		reset0 = 0
	end
	out[n + 1], out[n + 2] = floor(rem0), ceil(reset0)
	n = n + 2
end
return out
